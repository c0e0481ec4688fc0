"""Perfetto's own protobuf trace (`.pftrace`) of a run, written with the `perfetto` package's
streaming trace builder: the tracks, slices, flows and counters of the JSON export
(`export.py`) at a small fraction of its size, so that Perfetto's UI opens runs whose JSON it
cannot.

Layout (perfetto.dev, "Converting arbitrary timestamped data to Perfetto"; the protos
trace_packet.proto, clock_snapshot.proto, track_descriptor.proto, track_event.proto):
- a process track per rank, named as in the JSON export (pid = rank + 1: pid 0 is the idle
  "swapper" process in a protobuf trace); under it, in the JSON export's order, the
  `iterations (ProfilerStep)` track, one child track per resource stream, and one counter
  track per port utilisation and per expert's routed tokens;
- the tracks' events one track after another on one packet sequence; at each track a packet
  clears the sequence's incremental state, makes the track every event's default and
  defines a sequence-scoped clock (id 64) whose timestamps are deltas in ns from the
  previous packet, so that an event costs a few bytes;
- a name used more than once on a track interned (`InternedData`), one used once inline; the
  category on every slice where a track mixes categories, else in the track's description;
- a slice is a begin / end pair; a message's flow leaves the sender's slice (`flow_ids`) and
  ends on the receiver's `in:` slice (`terminating_flow_ids`).
Emulated times are rounded to whole nanoseconds (Perfetto's unit); within a track a slice
never begins before the previous one ends (rounding can only make them touch).
"""
from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from typing import IO, Any, Iterable, Sequence

import numpy as np

from .experts import routing_counts
from .export import flow_pairs, iteration_spans, lanes, port_counters, process_name, \
    routing_counters
from .load import Run
from .rank_trace import RankTrace

CLOCK_ID = 64                    # the first sequence-scoped clock id (clock_snapshot.proto)
BOOTTIME = 6                     # ClockSnapshot.Clock.BOOTTIME, a trace's default clock
CLEARED = 1                      # TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
EXPLICIT = 3                     # TrackDescriptor.ChildTracksOrdering.EXPLICIT
BEGIN, END, COUNTER = 1, 2, 4    # TrackEvent.Type
NS = 1e9


def _builder(f: IO[bytes]) -> Any:
    """The `perfetto` package's streaming builder (an optional dependency: the CLI says
    in one line how to install it)."""
    from perfetto.trace_builder.proto_builder import \
        StreamingTraceProtoBuilder  # noqa: PLC0415
    return StreamingTraceProtoBuilder(f)


class _Sequence:
    """The packets of one track: timestamps as ns deltas on the sequence's own clock; a
    name used more than once on the track interned on first use, one used once written
    inline (interning it would cost more); the category on every slice only where the
    track mixes categories (else its description names the one)."""

    def __init__(self, builder: Any, seq: int, track: int, repeated: frozenset[str] = frozenset(),
                 category: bool = True) -> None:
        self.b, self.seq, self.now = builder, seq, 0
        self.repeated, self.category = repeated, category
        self.iids: dict[tuple[str, str], int] = {}
        p = builder.create_packet()
        p.trusted_packet_sequence_id = seq
        p.sequence_flags = CLEARED
        p.timestamp, p.timestamp_clock_id = 0, BOOTTIME
        p.trace_packet_defaults.timestamp_clock_id = CLOCK_ID
        p.trace_packet_defaults.track_event_defaults.track_uuid = track
        for clock_id, incremental in ((BOOTTIME, False), (CLOCK_ID, True)):
            c = p.clock_snapshot.clocks.add()
            c.clock_id, c.timestamp = clock_id, 0
            if incremental:
                c.is_incremental = True
        builder.write_packet(p)

    def _packet(self, t_ns: int) -> Any:
        p = self.b.create_packet()
        p.trusted_packet_sequence_id = self.seq
        p.timestamp, self.now = t_ns - self.now, t_ns
        return p

    def _iid(self, p: Any, kind: str, text: str) -> int:
        iid = self.iids.get((kind, text))
        if iid is None:
            iid = self.iids[(kind, text)] = len(self.iids) + 1
            entry = getattr(p.interned_data, kind).add()
            entry.iid, entry.name = iid, text
        return iid

    def slice(self, b_ns: int, e_ns: int, name: str, cat: str,
              flow_out: Iterable[int] = (), flow_in: Iterable[int] = ()) -> None:
        """A begin / end pair (the flows leave or end on it)."""
        p = self._packet(b_ns)
        te = p.track_event
        te.type = BEGIN
        if name in self.repeated:
            te.name_iid = self._iid(p, "event_names", name)
        else:
            te.name = name
        if self.category:
            te.category_iids.append(self._iid(p, "event_categories", cat))
        te.flow_ids.extend(flow_out)
        te.terminating_flow_ids.extend(flow_in)
        self.b.write_packet(p)
        p = self._packet(e_ns)
        p.track_event.type = END
        self.b.write_packet(p)

    def counter(self, t_ns: int, value: float) -> None:
        p = self._packet(t_ns)
        p.track_event.type = COUNTER
        if value == int(value):
            p.track_event.counter_value = int(value)
        else:
            p.track_event.double_counter_value = value
        self.b.write_packet(p)


class _Trace:
    """Track descriptors, and the packet sequence of each track in turn: one sequence id for
    all, its incremental state cleared and set afresh at each track (as Perfetto's SDK
    clears a sequence's state periodically), so that the id costs one byte however many
    tracks a run has."""

    SEQ = 1

    def __init__(self, f: IO[bytes]) -> None:
        self.b = _builder(f)
        self.uuid = 0

    def process(self, rank: int, name: str) -> int:
        self.uuid += 1
        p = self.b.create_packet()
        d = p.track_descriptor
        d.uuid, d.process.pid, d.process.process_name = self.uuid, rank + 1, name
        d.child_ordering = EXPLICIT
        self.b.write_packet(p)
        return self.uuid

    def track(self, parent: int, name: str, order: int, counter: bool = False,
              names: Sequence[str] = (), cats: Sequence[str] = ()) -> _Sequence:
        """A named child track of a process, and the sequence that writes its events
        (`names`, `cats`: those of its slices, in any order)."""
        self.uuid += 1
        p = self.b.create_packet()
        d = p.track_descriptor
        d.uuid, d.parent_uuid, d.name, d.sibling_order_rank = self.uuid, parent, name, order
        one_cat = len(set(cats)) == 1
        if one_cat:
            d.description = f"category of every slice: {cats[0]}"
        if counter:
            d.counter.SetInParent()
        self.b.write_packet(p)
        repeated = frozenset(n for n, k in Counter(names).items() if k > 1)
        return _Sequence(self.b, self.SEQ, self.uuid, repeated, not one_cat)


def _ns(t_s: np.ndarray | float) -> np.ndarray:
    """Seconds to whole nanoseconds."""
    return np.rint(np.asarray(t_s) * NS).astype(np.int64)


def _lane_slices(seq: _Sequence, rt: RankTrace, idx: np.ndarray, names: list[str],
                 cats: list[str], out: dict[int, list[int]], into: dict[int, list[int]]
                 ) -> None:
    """The events `idx` of one (sub-)track, in time order, as slices (`names`, `cats`:
    theirs)."""
    ev = rt.events
    b, e = _ns(ev["t_start"][idx]), _ns(ev["t_end"][idx])
    if len(idx) > 1:      # a rounded begin never before the previous end
        b[1:] = np.maximum(b[1:], np.maximum.accumulate(e)[:-1])
    e = np.maximum(e, b)
    for i, b_ns, e_ns, name, cat in zip(idx.tolist(), b.tolist(), e.tolist(), names, cats):
        seq.slice(b_ns, e_ns, str(name), str(cat), out.get(i, ()), into.get(i, ()))


def _counters(trace: _Trace, proc: int, order: int, events: Iterable[dict[str, Any]]) -> None:
    """Counter events of the JSON export (`ph: C`), one counter track per name and key."""
    series: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for e in events:
        for key, v in e["args"].items():
            name = e["name"] if len(e["args"]) == 1 else f"{e['name']}: {key}"
            series[name].append((int(round(e["ts"] * 1e3)), float(v)))
    for k, (name, points) in enumerate(series.items()):
        seq = trace.track(proc, name, order + k, counter=True)
        last = None
        for t_ns, v in sorted(points):
            if v != last:     # a counter holds its value until the next: repeats add nothing
                seq.counter(t_ns, v)
                last = v


def _rank(trace: _Trace, rt: RankTrace, flows: tuple[dict[int, list[int]], dict[int, list[int]]],
          counts: np.ndarray | None, images: list[int] | None) -> None:
    """One rank: its process, the iterations, every resource stream, its counters."""
    proc = trace.process(rt.rank, process_name(rt.rank, images))
    steps = trace.track(proc, "iterations (ProfilerStep)", 0, cats=["user_annotation"])
    for it, t0, t1 in iteration_spans(rt):
        steps.slice(int(_ns(t0)), int(_ns(t1)), f"ProfilerStep#{it}", "user_annotation")
    tids, per_event = lanes(rt)
    ev = rt.events
    for res, tid in tids.items():
        idx = np.flatnonzero(per_event == tid)
        idx = idx[np.lexsort((ev["t_end"][idx], ev["t_start"][idx]))]     # time order
        names, cats = rt.names[idx].tolist(), rt.cats[idx].tolist()
        _lane_slices(trace.track(proc, res, tid, names=names, cats=cats), rt, idx, names,
                     cats, *flows)
    _counters(trace, proc, len(tids) + 1,
              [*port_counters(rt), *routing_counters(rt, counts)])


def write_perfetto(run: Run, path: Path | str) -> Path:
    """The run as one Perfetto protobuf trace (`.pftrace`), every rank a process."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    out: dict[int, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    into: dict[int, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for n, (r, i, r2, i2) in enumerate(flow_pairs(run).tolist(), start=1):
        out[r][i].append(n)
        into[r2][i2].append(n)
    counts = routing_counts(run)
    with open(path, "wb") as f:
        trace = _Trace(f)
        for rt in run.ranks:
            _rank(trace, rt, (out[rt.rank], into[rt.rank]), counts, run.stands_for.get(rt.rank))
    return path

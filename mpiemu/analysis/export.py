"""Chrome trace-event JSON for Perfetto (and Holistic Trace Analysis), from a run directory.

One process per rank (pid = rank), one thread per resource stream (compute, comm.tp, a
message route `port.0.out>port.1.in`, ...), so overlapping compute and communication never
nest badly (Perfetto's nesting rule); events of one resource that overlap without nesting
(flows sharing a port) go to numbered sub-threads (`port.0.out>port.1.in #1`). Each network
port gets a counter track of its utilisation (busy share per time bin, from the messages
leaving through it), and each message a flow arrow from its sender's slice to the receiver's
`in:` slice. Times are emulated, in microseconds. Collective summaries sit on
their own `coll.<group>` thread. Per iteration a `ProfilerStep#<n>` span is added. (The HTA
layout is `analysis/hta.py`.)
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from .experts import routing_counts
from .load import Run
from .rank_trace import RankTrace
from .network import egress_port

US = 1e6


def lanes(rt: RankTrace) -> tuple[dict[str, int], np.ndarray]:
    """Thread ids per (sub-)track, compute first, and each event's thread: events of one
    resource that overlap go to the first sub-track free at their start (greedy packing;
    a resource whose events never overlap, the usual case, is packed without a loop)."""
    ev = rt.events
    codes = ev["resource"].astype(np.int64)
    order = np.lexsort((-ev["t_end"], ev["t_start"], codes))
    slot = np.zeros(len(ev), dtype=np.int64)
    lanes: dict[str, int] = {}
    bounds = np.flatnonzero(np.diff(codes[order])) + 1
    for grp in np.split(order, bounds) if len(order) else []:
        res = str(rt.resources[grp[0]])
        t0, t1 = ev["t_start"][grp], ev["t_end"][grp]
        if len(grp) < 2 or np.all(t0[1:] >= np.maximum.accumulate(t1)[:-1] - 1e-15):
            lanes[res] = 1
            continue
        ends: list[float] = []
        for i, a, b in zip(grp.tolist(), t0.tolist(), t1.tolist()):
            k = next((j for j, e in enumerate(ends) if e <= a + 1e-15), len(ends))
            if k == len(ends):
                ends.append(b)
            else:
                ends[k] = b
            slot[i] = k
        lanes[res] = len(ends)
    names = sorted((f"{r} #{k}" if k else r for r, n in lanes.items() if r != "-"
                    for k in range(n)), key=lambda r: (r != "compute", r))
    tids = {r: i + 1 for i, r in enumerate(names)}
    lane0 = {code: tids.get(str(rt.resources[i]), 0)
             for code, i in zip(*np.unique(codes, return_index=True))}
    per_event = np.array([lane0[c] for c in codes.tolist()], dtype=np.int64)
    for i in np.flatnonzero(slot).tolist():
        per_event[i] = tids[f"{rt.resources[i]} #{slot[i]}"]
    return tids, per_event


def port_counters(rt: RankTrace, bins: int = 200) -> Iterator[dict[str, Any]]:
    """Counter tracks: each egress port's busy share per time bin (messages leaving it)."""
    ev = rt.events
    busy: dict[str, list[tuple[float, float]]] = {}
    for res, idx in rt.by_resource():
        port = egress_port(res)
        if port is None:
            continue
        idx = idx[rt.is_cat("comm", idx)]
        busy.setdefault(port, []).extend(zip(ev["t_start"][idx].tolist(),
                                             ev["t_end"][idx].tolist()))
    if not busy:
        return
    t_end = max(b for iv in busy.values() for _, b in iv)
    width = t_end / bins if t_end > 0 else 1.0
    for port, iv in sorted(busy.items()):
        share = np.zeros(bins)
        for a, b in _union(iv):
            for k in range(int(a // width), min(bins, int(b // width) + 1)):
                lo, hi = k * width, (k + 1) * width
                share[k] += max(0.0, min(b, hi) - max(a, lo)) / width
        for k in range(bins):
            yield {"ph": "C", "pid": rt.rank, "name": f"{port} utilisation",
                   "ts": k * width * US, "args": {"busy": round(float(share[k]), 6)}}


def _union(iv: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def spans(ids: list[int]) -> str:
    """[128, 129, 130, 200] -> '128-130, 200'."""
    out: list[str] = []
    for i in sorted(ids):
        if out and out[-1].split("-")[-1] == str(i - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{i}"
        else:
            out.append(str(i))
    return ", ".join(out)


def process_name(rank: int, images: list[int] | None = None) -> str:
    """A rank's process name; a folded representative's says whom it stands for."""
    if not images or images == [rank]:
        return f"rank {rank}"
    return f"rank {rank} (stands for {len(images)} GPUs: ranks {spans(images)})"


def _meta(rank: int, tids: dict[str, int], name: str) -> Iterator[dict[str, Any]]:
    yield {"ph": "M", "pid": rank, "tid": 0, "name": "process_name",
           "args": {"name": name}}
    yield {"ph": "M", "pid": rank, "tid": 0, "name": "thread_name",
           "args": {"name": "iterations (ProfilerStep)"}}
    yield {"ph": "M", "pid": rank, "tid": 0, "name": "process_sort_index",
           "args": {"sort_index": rank}}
    for res, tid in tids.items():
        yield {"ph": "M", "pid": rank, "tid": tid, "name": "thread_name", "args": {"name": res}}
        yield {"ph": "M", "pid": rank, "tid": tid, "name": "thread_sort_index",
               "args": {"sort_index": tid}}


def _slices(rt: RankTrace, per_event: np.ndarray) -> list[str]:
    """Every event of the rank as a JSON object (text: a list comprehension over plain
    lists, not a dict per event, keeps 100k-event ranks to a fraction of a second)."""
    ev = rt.events
    keep = np.flatnonzero(rt.resources != "-")
    esc = {n: json.dumps(str(n)) for n in set(rt.names[keep].tolist())}
    cols = [keep.tolist(), per_event[keep].tolist(), rt.names[keep].tolist(),
            rt.cats[keep].tolist(), (ev["t_start"][keep] * US).tolist(),
            ((ev["t_end"][keep] - ev["t_start"][keep]) * US).tolist(),
            ev["flops"][keep].astype(float).tolist(), ev["bytes"][keep].astype(int).tolist(),
            ev["dram_bytes"][keep].astype(int).tolist(),
            *(ev[f][keep].astype(int).tolist() for f in ("layer", "iteration", "peer", "stage")),
            rt.phases[keep].tolist()]
    pid = rt.rank
    return [f'{{"ph": "X", "pid": {pid}, "tid": {tid}, "name": {esc[n]}, "cat": "{c}", '
            f'"ts": {ts!r}, "dur": {d!r}, "args": {{"stream": {tid}, "correlation": {i}, '
            f'"flops": {fl!r}, "bytes": {by}, "dram_bytes": {dr}, "layer": {ly}, '
            f'"iteration": {it}, "peer": {pe}, "stage": {st}, "phase": "{ph}"}}}}'
            for i, tid, n, c, ts, d, fl, by, dr, ly, it, pe, st, ph in zip(*cols)]


def iteration_spans(rt: RankTrace) -> Iterator[tuple[int, float, float]]:
    """(iteration, first start, last end) of every labelled iteration of a rank."""
    ev = rt.events
    for it in np.unique(ev["iteration"]):
        if it < 0:
            continue
        m = ev["iteration"] == it
        yield int(it), float(ev["t_start"][m].min()), float(ev["t_end"][m].max())


def _steps(rt: RankTrace) -> Iterator[dict[str, Any]]:
    """One `ProfilerStep#n` span per iteration, on thread 0."""
    for it, t0, t1 in iteration_spans(rt):
        yield {"ph": "X", "pid": rt.rank, "tid": 0, "name": f"ProfilerStep#{it}",
               "cat": "user_annotation", "ts": t0 * US, "dur": (t1 - t0) * US}


def routing_counters(rt: RankTrace, counts: np.ndarray | None) -> Iterator[dict[str, Any]]:
    """An MoE run: the tokens this rank sent to each expert in each iteration (summed over
    layers, `routing.npz`), a counter at the iteration's start."""
    if counts is None or rt.rank >= counts.shape[2]:
        return
    for it, t0, _ in iteration_spans(rt):
        if it < counts.shape[0]:
            per = counts[it, :, rt.rank].sum(0)
            yield {"ph": "C", "pid": rt.rank, "name": "tokens sent per expert", "ts": t0 * US,
                   "args": {f"expert {e}": int(n) for e, n in enumerate(per)}}


def rank_events(rt: RankTrace, threads: tuple[dict[str, int], np.ndarray] | None = None,
                counts: np.ndarray | None = None, images: list[int] | None = None
                ) -> list[str]:
    """All trace events of one rank, each as JSON text (`counts`: an MoE run's routing;
    `images`: the emulated ranks a folded representative stands for)."""
    tids, per_event = threads or lanes(rt)
    small = [*_meta(rt.rank, tids, process_name(rt.rank, images)), *_steps(rt),
             *port_counters(rt), *routing_counters(rt, counts)]
    return [json.dumps(e) for e in small] + _slices(rt, per_event)


def _messages(rt: RankTrace, inbox: bool, route_id: dict[str, int]) -> np.ndarray:
    """The rank's message records (sends on a route, or `in:` receives) as rows of
    (route id, start, rank, event index)."""
    rows = []
    for name, idx in rt.by_resource():
        route = name[3:] if inbox and name.startswith("in:") else \
            (name if not inbox and egress_port(name) is not None else None)
        if route is None:
            continue
        if not inbox:
            idx = idx[rt.is_cat("comm", idx)]
        gid = route_id.setdefault(route, len(route_id))
        rows.append(np.stack([np.full(len(idx), gid, dtype=float), rt.events["t_start"][idx],
                              np.full(len(idx), rt.rank, dtype=float), idx.astype(float)], 1))
    return np.concatenate(rows) if rows else np.zeros((0, 4))


def flow_pairs(run: Run) -> np.ndarray:
    """One row per message, (sender rank, its event, receiver rank, its `in:` event), in
    the senders' order. Both events carry the message's start time (`net.message`), so
    (route, start) pairs them; equal keys pair in order (rank, then event)."""
    route_id: dict[str, int] = {}
    sends = np.concatenate([_messages(rt, False, route_id) for rt in run.ranks])
    recvs = np.concatenate([_messages(rt, True, route_id) for rt in run.ranks])
    both = np.concatenate([sends, recvs])
    side = np.r_[np.zeros(len(sends)), np.ones(len(recvs))]
    # sorted by key, sends before receives, each in (rank, event) order: the k-th send of a
    # (route, start) key meets the k-th receive of the same key
    order = np.lexsort((both[:, 3], both[:, 2], side, both[:, 1], both[:, 0]))
    key, s_sorted = both[order][:, :2], side[order]
    new = np.r_[True, np.any(key[1:] != key[:-1], axis=1)] if len(key) else np.zeros(0, bool)
    grp = np.cumsum(new) - 1
    first_of = np.flatnonzero(new)
    n_send = np.bincount(grp, weights=1 - s_sorted, minlength=len(first_of)).astype(int)
    n_recv = np.bincount(grp, weights=s_sorted, minlength=len(first_of)).astype(int)
    j = np.flatnonzero(s_sorted == 0)
    g, k = grp[j], j - first_of[grp[j]]
    ok = k < n_recv[g]
    snd = both[order[j[ok]]]
    rcv = both[order[first_of[g[ok]] + n_send[g[ok]] + k[ok]]]
    by_sender = np.lexsort((snd[:, 3], snd[:, 2]))
    return np.stack([snd[by_sender, 2], snd[by_sender, 3], rcv[by_sender, 2],
                     rcv[by_sender, 3]], 1).astype(np.int64)


def _flows(run: Run, threads: dict[int, np.ndarray]) -> list[str]:
    """Perfetto flow arrows, one per message: from the sender's slice on its route to the
    receiver's `in:<route>` slice, at the message's start."""
    start = {rt.rank: rt.events["t_start"] for rt in run.ranks}
    out: list[str] = []
    for n, (r, i, r2, i2) in enumerate(flow_pairs(run).tolist(), start=1):
        ts = float(start[r][i]) * US
        out.append(f'{{"ph": "s", "id": {n}, "pid": {r}, "tid": {threads[r][i]}, '
                   f'"ts": {ts!r}, "name": "message", "cat": "flow"}}')
        out.append(f'{{"ph": "f", "bp": "e", "id": {n}, "pid": {r2}, '
                   f'"tid": {threads[r2][i2]}, "ts": {ts!r}, "name": "message", '
                   f'"cat": "flow"}}')
    return out


def _chunks(run: Run) -> Iterator[str]:
    """The trace-event document as text pieces (one rank at a time: a 64-rank run's JSON
    is gigabytes, never held as one string)."""
    other = json.dumps({"clock": "emulated", "run": str(run.path),
                        "workload": run.manifest.get("config", {}).get("name", "")})
    yield '{"traceEvents": ['
    per_rank: dict[int, np.ndarray] = {}
    sep = ""
    counts = routing_counts(run)
    for rt in run.ranks:
        threads = lanes(rt)
        per_rank[rt.rank] = threads[1]
        yield sep + ", ".join(rank_events(rt, threads, counts, run.stands_for.get(rt.rank)))
        sep = ", "
    flows = _flows(run, per_rank)
    if flows:
        yield sep + ", ".join(flows)
    yield f'], "displayTimeUnit": "ns", "otherData": {other}}}'


def chrome_trace(run: Run) -> dict[str, Any]:
    """The whole run as one trace-event document (all ranks as processes)."""
    doc: dict[str, Any] = json.loads("".join(_chunks(run)))
    return doc


def _dump(chunks: Iterator[str], path: Path) -> None:
    if path.suffix == ".gz":       # fast compression: the text is large and regular
        with gzip.open(path, "wt", compresslevel=1) as f:
            f.writelines(chunks)
    else:
        with open(path, "w") as f:
            f.writelines(chunks)


def write_chrome(run: Run, path: Path) -> Path:
    """One JSON (or .json.gz) for Perfetto / chrome://tracing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _dump(_chunks(run), path)
    return path

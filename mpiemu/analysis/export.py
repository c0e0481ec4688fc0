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

from .load import RankTrace, Run
from .network import egress_port

US = 1e6


def _threads(rt: RankTrace) -> tuple[dict[str, int], list[int]]:
    """Thread ids per (sub-)track, compute first, and each event's thread: events of one
    resource that overlap go to the first sub-track free at their start (greedy packing)."""
    ev = rt.events
    order = np.lexsort((-ev["t_end"], ev["t_start"]))
    lanes: dict[str, list[float]] = {}
    slot = [0] * len(ev)
    for i in order:
        res = rt.resources[i]
        ends = lanes.setdefault(res, [])
        t0, t1 = float(ev["t_start"][i]), float(ev["t_end"][i])
        k = next((j for j, e in enumerate(ends) if e <= t0 + 1e-15), len(ends))
        if k == len(ends):
            ends.append(t1)
        else:
            ends[k] = t1
        slot[i] = k
    names = sorted((f"{r} #{k}" if k else r for r, ends in lanes.items() if r != "-"
                    for k in range(len(ends))), key=lambda r: (r != "compute", r))
    tids = {r: i + 1 for i, r in enumerate(names)}
    per_event = [tids.get(f"{r} #{k}" if k else r, 0) for r, k in zip(rt.resources, slot)]
    return tids, per_event


def _ports(rt: RankTrace, bins: int = 200) -> Iterator[dict[str, Any]]:
    """Counter tracks: each egress port's busy share per time bin (messages leaving it)."""
    ev = rt.events
    busy: dict[str, list[tuple[float, float]]] = {}
    for i, res in enumerate(rt.resources):
        port = egress_port(res)
        if rt.cats[i] == "comm" and port is not None:
            busy.setdefault(port, []).append((float(ev["t_start"][i]), float(ev["t_end"][i])))
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


def _meta(rank: int, tids: dict[str, int]) -> Iterator[dict[str, Any]]:
    yield {"ph": "M", "pid": rank, "tid": 0, "name": "process_name",
           "args": {"name": f"rank {rank}"}}
    yield {"ph": "M", "pid": rank, "tid": 0, "name": "thread_name",
           "args": {"name": "iterations (ProfilerStep)"}}
    yield {"ph": "M", "pid": rank, "tid": 0, "name": "process_sort_index",
           "args": {"sort_index": rank}}
    for res, tid in tids.items():
        yield {"ph": "M", "pid": rank, "tid": tid, "name": "thread_name", "args": {"name": res}}
        yield {"ph": "M", "pid": rank, "tid": tid, "name": "thread_sort_index",
               "args": {"sort_index": tid}}


def _slices(rt: RankTrace, per_event: list[int]) -> Iterator[dict[str, Any]]:
    ev = rt.events
    for i in range(len(ev)):
        res = rt.resources[i]
        if res == "-":
            continue
        cat = rt.cats[i]
        name = str(rt.names[i])
        args: dict[str, Any] = {"stream": per_event[i], "correlation": i}
        for field in ("flops", "bytes", "dram_bytes"):
            v = ev[field][i]
            if v:
                args[field] = float(v) if field == "flops" else int(v)
        for field in ("layer", "iteration", "peer", "stage"):
            v = int(ev[field][i])
            if v >= 0:
                args[field] = v
        if rt.phases[i] != "none":
            args["phase"] = rt.phases[i]
        yield {"ph": "X", "pid": rt.rank, "tid": per_event[i], "name": name,
               "cat": cat, "ts": float(ev["t_start"][i]) * US,
               "dur": float(ev["t_end"][i] - ev["t_start"][i]) * US, "args": args}


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


def rank_events(rt: RankTrace, threads: tuple[dict[str, int], list[int]] | None = None
                ) -> list[dict[str, Any]]:
    """All trace events of one rank."""
    tids, per_event = threads or _threads(rt)
    return [*_meta(rt.rank, tids), *_steps(rt), *_slices(rt, per_event), *_ports(rt)]


def _flows(run: Run, threads: dict[int, list[int]]) -> Iterator[dict[str, Any]]:
    """Perfetto flow arrows, one per message: from the sender's slice on its route to the
    receiver's `in:<route>` slice. Both carry the message's start time (`net.message`), so
    (route, start) pairs them; equal keys pair in order."""
    inbox: dict[tuple[str, float], list[tuple[int, int]]] = {}
    for rt in run.ranks:
        t0 = rt.events["t_start"]
        for i, res in enumerate(rt.resources):
            if res.startswith("in:"):
                inbox.setdefault((res[3:], float(t0[i])), []).append((rt.rank, i))
    k = 0
    for rt in run.ranks:
        t0 = rt.events["t_start"]
        for i, res in enumerate(rt.resources):
            if rt.cats[i] != "comm" or egress_port(res) is None:
                continue
            match = inbox.get((res, float(t0[i])))
            if not match:
                continue
            r, j = match.pop(0)
            k += 1
            ts = float(t0[i]) * US
            yield {"ph": "s", "id": k, "pid": rt.rank, "tid": threads[rt.rank][i],
                   "ts": ts, "name": "message", "cat": "flow"}
            yield {"ph": "f", "bp": "e", "id": k, "pid": r, "tid": threads[r][j], "ts": ts,
                   "name": "message", "cat": "flow"}


def chrome_trace(run: Run) -> dict[str, Any]:
    """The whole run as one trace-event document (all ranks as processes)."""
    events: list[dict[str, Any]] = []
    per_rank: dict[int, list[int]] = {}
    for rt in run.ranks:
        threads = _threads(rt)
        per_rank[rt.rank] = threads[1]
        events += rank_events(rt, threads)
    events += _flows(run, per_rank)
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"clock": "emulated", "run": str(run.path),
                          "workload": run.manifest.get("config", {}).get("name", "")}}


def _dump(doc: dict[str, Any], path: Path) -> None:
    text = json.dumps(doc)          # default separators: HTA's rank regex needs ": "
    if path.suffix == ".gz":
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)


def write_chrome(run: Run, path: Path) -> Path:
    """One JSON (or .json.gz) for Perfetto / chrome://tracing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _dump(chrome_trace(run), path)
    return path

"""Chrome trace-event JSON for Perfetto (and Holistic Trace Analysis), from a run directory.

One process per rank (pid = rank), one thread per resource stream (compute, comm.tp,
link.tp.next, ...), so overlapping compute and communication never nest badly (Perfetto's
nesting rule). Times are emulated, in microseconds. Collective summaries sit on their own
`coll.<group>` thread. Per iteration a `ProfilerStep#<n>` span is added, and communication
kernels get an `nccl`-style name prefix, as HTA expects (reference/conventions.md B.4).
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from .load import RankTrace, Run

US = 1e6
HTA_COMM_PREFIX = {"comm": "ncclKernel_", "collective": "ncclKernel_"}


def _threads(rt: RankTrace) -> dict[str, int]:
    """Stable thread ids per resource: compute first, then the rest sorted."""
    names = sorted(set(rt.resources) - {"-"}, key=lambda r: (r != "compute", r))
    return {r: i + 1 for i, r in enumerate(names)}


def _meta(rank: int, tids: dict[str, int]) -> Iterator[dict[str, Any]]:
    yield {"ph": "M", "pid": rank, "tid": 0, "name": "process_name",
           "args": {"name": f"rank {rank}"}}
    yield {"ph": "M", "pid": rank, "tid": 0, "name": "process_sort_index",
           "args": {"sort_index": rank}}
    for res, tid in tids.items():
        yield {"ph": "M", "pid": rank, "tid": tid, "name": "thread_name", "args": {"name": res}}
        yield {"ph": "M", "pid": rank, "tid": tid, "name": "thread_sort_index",
               "args": {"sort_index": tid}}


def _slices(rt: RankTrace, tids: dict[str, int], hta: bool) -> Iterator[dict[str, Any]]:
    ev = rt.events
    for i in range(len(ev)):
        res = rt.resources[i]
        if res == "-":
            continue
        cat = rt.cats[i]
        name = str(rt.names[i])
        if hta and cat in HTA_COMM_PREFIX:
            name = HTA_COMM_PREFIX[cat] + name
        args: dict[str, Any] = {"stream": tids[res], "correlation": i}
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
        yield {"ph": "X", "pid": rt.rank, "tid": tids[res], "name": name,
               "cat": "kernel" if hta else cat, "ts": float(ev["t_start"][i]) * US,
               "dur": float(ev["t_end"][i] - ev["t_start"][i]) * US, "args": args}


def _steps(rt: RankTrace) -> Iterator[dict[str, Any]]:
    """One `ProfilerStep#n` span per iteration, on thread 0."""
    ev = rt.events
    for it in np.unique(ev["iteration"]):
        if it < 0:
            continue
        m = ev["iteration"] == it
        t0, t1 = float(ev["t_start"][m].min()), float(ev["t_end"][m].max())
        yield {"ph": "X", "pid": rt.rank, "tid": 0, "name": f"ProfilerStep#{int(it)}",
               "cat": "user_annotation", "ts": t0 * US, "dur": (t1 - t0) * US}


def rank_events(rt: RankTrace, hta: bool = False) -> list[dict[str, Any]]:
    """All trace events of one rank."""
    tids = _threads(rt)
    return [*_meta(rt.rank, tids), *_steps(rt), *_slices(rt, tids, hta)]


def chrome_trace(run: Run, hta: bool = False) -> dict[str, Any]:
    """The whole run as one trace-event document (all ranks as processes)."""
    events: list[dict[str, Any]] = []
    for rt in run.ranks:
        events += rank_events(rt, hta)
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


def write_hta(run: Run, out_dir: Path) -> list[Path]:
    """One file per rank with `distributedInfo`, the layout HTA's TraceAnalysis reads."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for rt in run.ranks:
        doc = {"distributedInfo": {"backend": "mpiemu", "rank": rt.rank,
                                   "world_size": len(run.ranks)},
               "traceEvents": rank_events(rt, hta=True)}
        p = out_dir / f"rank-{rt.rank:05d}.json.gz"
        _dump(doc, p)
        paths.append(p)
    return paths

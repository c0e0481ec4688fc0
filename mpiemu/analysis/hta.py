"""Per-rank traces in the layout Holistic Trace Analysis (HTA) reads: a PyTorch profiler trace.

HTA relates each GPU kernel to the CPU `cudaLaunchKernel` that launched it (same
`correlation`) and each launch to the `ProfilerStep#n` annotation around it, which is how it
assigns kernels to iterations; a kernel without a launch is dropped. So every emulated op of
a rank becomes a kernel on a GPU stream (pid 0; a stream per resource: compute, each
communication stream, each message route; communication kernels named `ncclKernel_...`,
which HTA classifies as communication), launched by a runtime event on the CPU thread
(pid 1) at the kernel's start, inside that iteration's `ProfilerStep#n`. Each stream's launches
sit on a CPU thread of their own and last 1 ns (0 where the stream's next kernel starts in the
same ns), because HTA's critical-path analysis keeps only CPU events of positive duration and
needs each thread's events properly nested; the launch -> kernel edge then weighs 0 and the
path runs through the kernels themselves. HTA keeps whole
units of its time field and emulated ops are often sub-microsecond, so the `ts` / `dur`
fields hold whole NANOSECONDS (HTA labels them us: read its times as ns; `UNIT` below).
Collective summaries and `in:` receive records are not kernels (their messages are).
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Iterator

from .export import iteration_spans
from .load import RankTrace, Run

UNIT = 1e9          # ts / dur in integer nanoseconds (HTA reads whole units)
GPU_PID, CPU_PID, CPU_TID = 0, 1, 1
LAUNCH_TID = 100        # + stream id: the CPU thread that launches that stream's kernels
KERNEL_CATS = ("compute", "comm", "memory")


def _ns(t: float) -> int:
    return int(round(float(t) * UNIT))


def _streams(rt: RankTrace) -> dict[str, int]:
    names = sorted({str(r) for r, c in zip(rt.resources, rt.cats)
                    if c in KERNEL_CATS and not str(r).startswith("in:")},
                   key=lambda r: (r != "compute", r))
    return {r: 7 + i for i, r in enumerate(names)}          # PyTorch's default stream is 7


def _steps(rt: RankTrace) -> Iterator[dict[str, Any]]:
    for it, start, end in iteration_spans(rt):
        t0, t1 = _ns(start), _ns(end)
        yield {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{it}",
               "pid": CPU_PID, "tid": CPU_TID, "ts": t0, "dur": t1 - t0, "args": {}}


def _kernels(rt: RankTrace, streams: dict[str, int]) -> Iterator[dict[str, Any]]:
    ev = rt.events
    rows = [i for i in range(len(ev)) if str(rt.resources[i]) in streams
            and str(rt.cats[i]) in KERNEL_CATS]
    starts = {i: _ns(ev["t_start"][i]) for i in rows}
    rows.sort(key=lambda i: (streams[str(rt.resources[i])], starts[i], i))
    for j, i in enumerate(rows):
        res, cat = str(rt.resources[i]), str(rt.cats[i])
        ts, tid = starts[i], streams[res]
        dur = _ns(ev["t_end"][i]) - ts
        nxt = rows[j + 1] if j + 1 < len(rows) else None
        free = nxt is None or streams[str(rt.resources[nxt])] != tid or starts[nxt] > ts
        name = ("ncclKernel_" if cat == "comm" else "") + str(rt.names[i])
        yield {"ph": "X", "cat": "kernel", "name": name, "pid": GPU_PID,
               "tid": tid, "ts": ts, "dur": dur,
               "args": {"stream": tid, "correlation": i + 1, "device": GPU_PID,
                        "iteration": int(ev["iteration"][i])}}
        yield {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": CPU_PID,
               "tid": LAUNCH_TID + tid, "ts": ts, "dur": int(free),
               "args": {"correlation": i + 1, "cbid": 211}}


def hta_events(rt: RankTrace) -> list[dict[str, Any]]:
    """All events of one rank in the PyTorch profiler layout."""
    streams = _streams(rt)
    meta = [{"ph": "M", "pid": GPU_PID, "name": "process_name", "args": {"name": "GPU 0"}},
            {"ph": "M", "pid": CPU_PID, "name": "process_name",
             "args": {"name": f"rank {rt.rank} (emulated)"}}]
    meta += [{"ph": "M", "pid": GPU_PID, "tid": tid, "name": "thread_name",
              "args": {"name": f"stream {tid} {res}"}} for res, tid in streams.items()]
    meta += [{"ph": "M", "pid": CPU_PID, "tid": LAUNCH_TID + tid, "name": "thread_name",
              "args": {"name": f"launches of stream {tid}"}} for tid in streams.values()]
    return [*meta, *_steps(rt), *_kernels(rt, streams)]


def write_hta(run: Run, out_dir: Path) -> list[Path]:
    """One file per rank with `distributedInfo`, as HTA's TraceAnalysis reads a directory."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for rt in run.ranks:
        doc = {"schemaVersion": 1,
               "distributedInfo": {"backend": "nccl", "rank": rt.rank,
                                   "world_size": len(run.ranks)},
               "deviceProperties": [{"id": 0, "name": str(rt.attrs.get("device", "emulated"))
                                     [:60]}],
               "traceEvents": hta_events(rt)}
        p = out_dir / f"rank-{rt.rank:05d}.json.gz"
        with gzip.open(p, "wt") as f:
            f.write(json.dumps(doc))        # default separators: HTA's rank regex needs ": "
        paths.append(p)
    return paths

"""Per-rank traces in the layout Holistic Trace Analysis (HTA) reads: a PyTorch profiler trace.

HTA relates each GPU kernel to the CPU `cudaLaunchKernel` that launched it (same
`correlation`) and each launch to the `ProfilerStep#n` annotation around it, which is how it
assigns kernels to iterations; a kernel without a launch is dropped. So every emulated op of
a rank becomes a kernel on a GPU stream (pid 0; a stream per resource: compute, each
communication stream, each message route; communication kernels named `ncclKernel_...`,
which HTA classifies as communication), launched by a runtime event on the CPU thread
(pid 1) 1 ns before the kernel starts (strictly before: HTA's queue length sorts launches and
kernels by time alone), inside that iteration's `ProfilerStep#n` (shifted 1 ns earlier with
them). Each stream's launches sit on a CPU thread of their own and last 1 ns (0 where the
stream's next kernel starts in the same ns), because HTA's critical-path analysis keeps only
CPU events of positive duration and needs each thread's events properly nested; the launch
-> kernel edge then weighs 0 and the path runs through the kernels themselves.

Times are in HTA's own unit, microseconds, with nanosecond decimals. HTA 0.5 rounds such
timestamps to whole microseconds (dropping sub-microsecond kernels) unless
`HTA_DISABLE_NS_ROUNDING=1` is set in its environment: set it before `TraceAnalysis`.
Collective summaries and `in:` receive records are not kernels (their messages are).
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Iterator

import numpy as np

from .export import iteration_spans, process_name
from .load import Run
from .rank_trace import RankTrace

NS = 1e9            # emulated seconds -> whole nanoseconds, written as microseconds
GPU_PID, CPU_PID, CPU_TID = 0, 1, 1
LAUNCH_TID = 100        # + stream id: the CPU thread that launches that stream's kernels
KERNEL_CATS = ("compute", "comm", "memory")


def _kernel_mask(rt: RankTrace) -> np.ndarray:
    """Events that are kernels: compute, communication or memory ops on a stream or route
    (not `in:` receive records, not collective summaries)."""
    keep = np.zeros(len(rt.events), dtype=bool)
    for c in KERNEL_CATS:
        keep |= rt.is_cat(c)
    for res, idx in rt.by_resource():
        if res.startswith("in:"):
            keep[idx] = False
    return keep


def _streams(rt: RankTrace, keep: np.ndarray) -> dict[str, int]:
    names = sorted({str(r) for r in rt.resources[keep].tolist()},
                   key=lambda r: (r != "compute", r))
    return {r: 7 + i for i, r in enumerate(names)}          # PyTorch's default stream is 7


def _us(ns: int) -> str:
    """Whole nanoseconds as a JSON number of microseconds, exactly (3 decimals)."""
    sign, ns = ("-", -ns) if ns < 0 else ("", ns)
    return f"{sign}{ns // 1000}.{ns % 1000:03d}"


def _steps(rt: RankTrace) -> Iterator[str]:
    """Each iteration's ProfilerStep, 1 ns earlier than the iteration (as the launches)."""
    for it, start, end in iteration_spans(rt):
        t0, t1 = int(round(start * NS)) - 1, int(round(end * NS)) - 1
        yield (f'{{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#{it}", '
               f'"pid": {CPU_PID}, "tid": {CPU_TID}, "ts": {_us(t0)}, "dur": {_us(t1 - t0)}, '
               '"args": {}}')


def _kernels(rt: RankTrace, keep: np.ndarray, streams: dict[str, int]) -> list[str]:
    """Each kernel and its launch, as JSON text, in stream order; a launch lasts 1 ns unless
    the stream's next kernel starts in the same ns (then 0: the thread's events must nest)."""
    ev = rt.events
    idx = np.flatnonzero(keep)
    tid = np.array([streams[str(r)] for r in rt.resources[idx].tolist()], dtype=np.int64)
    ts = np.round(ev["t_start"][idx] * NS).astype(np.int64)
    dur = np.round(ev["t_end"][idx] * NS).astype(np.int64) - ts
    order = np.lexsort((idx, ts, tid))
    idx, tid, ts, dur = idx[order], tid[order], ts[order], dur[order]
    free = np.ones(len(idx), dtype=np.int64)
    free[:-1] = (tid[1:] != tid[:-1]) | (ts[1:] > ts[:-1])
    names = [("ncclKernel_" if c == "comm" else "") + str(n)
             for n, c in zip(rt.names[idx].tolist(), rt.cats[idx].tolist())]
    esc = {n: json.dumps(n) for n in set(names)}
    its = ev["iteration"][idx].astype(int).tolist()
    out: list[str] = []
    for i, t, a, d, f, n, it in zip(idx.tolist(), tid.tolist(), ts.tolist(), dur.tolist(),
                                    free.tolist(), names, its):
        out.append(f'{{"ph": "X", "cat": "kernel", "name": {esc[n]}, "pid": {GPU_PID}, '
                   f'"tid": {t}, "ts": {_us(a)}, "dur": {_us(d)}, "args": {{"stream": {t}, '
                   f'"correlation": {i + 1}, "device": {GPU_PID}, "iteration": {it}}}}}')
        out.append(f'{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", '
                   f'"pid": {CPU_PID}, "tid": {LAUNCH_TID + t}, "ts": {_us(a - 1)}, '
                   f'"dur": {_us(f)}, "args": {{"correlation": {i + 1}, "cbid": 211}}}}')
    return out


def hta_events(rt: RankTrace, images: list[int] | None = None) -> list[str]:
    """All events of one rank in the PyTorch profiler layout, each as JSON text (`images`:
    the emulated ranks a folded representative stands for, named in its process)."""
    keep = _kernel_mask(rt)
    streams = _streams(rt, keep)
    meta = [{"ph": "M", "pid": GPU_PID, "name": "process_name", "args": {"name": "GPU 0"}},
            {"ph": "M", "pid": CPU_PID, "name": "process_name",
             "args": {"name": f"{process_name(rt.rank, images)} (emulated)"}}]
    meta += [{"ph": "M", "pid": GPU_PID, "tid": tid, "name": "thread_name",
              "args": {"name": f"stream {tid} {res}"}} for res, tid in streams.items()]
    meta += [{"ph": "M", "pid": CPU_PID, "tid": LAUNCH_TID + tid, "name": "thread_name",
              "args": {"name": f"launches of stream {tid}"}} for tid in streams.values()]
    return [json.dumps(e) for e in meta] + list(_steps(rt)) + _kernels(rt, keep, streams)


def write_hta(run: Run, out_dir: Path) -> list[Path]:
    """One file per rank with `distributedInfo`, as HTA's TraceAnalysis reads a directory."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for rt in run.ranks:
        head = json.dumps({"schemaVersion": 1,
                           "distributedInfo": {"backend": "nccl", "rank": rt.rank,
                                               "world_size": len(run.ranks)},
                           "deviceProperties": [{"id": 0, "name": _device_name(rt)}]})
        p = out_dir / f"rank-{rt.rank:05d}.json.gz"
        with gzip.open(p, "wt", compresslevel=1) as f:   # ": " separators: HTA's rank regex
            f.write(head[:-1] + ', "traceEvents": [')
            f.write(", ".join(hta_events(rt, run.stands_for.get(rt.rank))))
            f.write("]}")
        paths.append(p)
    return paths


def _device_name(rt: RankTrace) -> str:
    """The preset name of the device a rank played (its attrs hold the whole spec)."""
    dev = rt.attrs.get("device", "emulated")
    if isinstance(dev, str) and dev.startswith("{"):
        try:
            dev = json.loads(dev)
        except ValueError:
            return dev
    return str(dev.get("name", "emulated")) if isinstance(dev, dict) else str(dev)

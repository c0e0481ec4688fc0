"""A layer executed as tiled tasks by a StarPU-like runtime on N GPUs (seed 002, NNTile).

Tasks are submitted in program order by one thread, each costing the runtime `submit_s`
(StarPU Handbook, Task Size Overhead: "a few microseconds" per task; its example, good
speedup up to 36 workers for 128 us tasks and 17 for 64 us, puts it at ~3.6 us). A task
runs when its inputs are done, on the GPU where it would finish first (StarPU's dmda: data
transfer included), paying the GPU's kernel launch on top of its kernel. Tiles start in
host memory (NNTile registers every tile on one node) and cross PCIe to the first GPU that
reads them, NVLink between GPUs; a write makes the writer's copy the only valid one.
Nothing here states a granularity threshold: short tasks lose to the per-task costs and
to the single submitting thread, long ones do not, as the schedule shows.
"""
from __future__ import annotations

from dataclasses import dataclass, field

HOST = -1


@dataclass(frozen=True)
class Runtime:
    """Per-task costs of the runtime and the links tiles travel on."""

    submit_s: float                 # one task through the submitting thread (serial)
    launch_s: float                 # per task on its GPU (CUDA launch, completion)
    host_bw_bytes_per_s: float      # host <-> GPU
    peer_bw_bytes_per_s: float      # GPU <-> GPU
    link_latency_s: float


@dataclass(frozen=True)
class Task:
    name: str
    kind: str                       # "gemm", "bias", "act", "reshape", "fused"
    exec_s: float                   # kernel time on one GPU
    reads: tuple[str, ...]
    writes: str
    deps: tuple[int, ...] = ()


@dataclass
class Schedule:
    """Where and when each task ran, and what the GPUs did meanwhile."""

    n_gpus: int
    spans: list[tuple[int, float, float]] = field(default_factory=list)   # (gpu, start, end)
    busy_s: list[float] = field(default_factory=list)

    @property
    def makespan(self) -> float:
        return max((end for _, _, end in self.spans), default=0.0)

    @property
    def efficiency(self) -> float:
        """Kernel time over GPU time: 1 when every GPU computes all along."""
        return sum(self.busy_s) / (self.n_gpus * self.makespan) if self.makespan else 0.0


def _transfer_s(rt: Runtime, nbytes: float, src: int, dst: int) -> float:
    bw = rt.host_bw_bytes_per_s if HOST in (src, dst) else rt.peer_bw_bytes_per_s
    return rt.link_latency_s + nbytes / bw


def run(tasks: list[Task], tile_bytes: dict[str, float], n_gpus: int, rt: Runtime) -> Schedule:
    """List-schedule the tasks on `n_gpus` GPUs (dmda: earliest finish, transfers counted)."""
    sched = Schedule(n_gpus, busy_s=[0.0] * n_gpus)
    free = [0.0] * n_gpus
    where: dict[str, set[int]] = {t: {HOST} for t in tile_bytes}
    ready_at: dict[str, float] = {t: 0.0 for t in tile_bytes}
    ends: list[float] = []
    for i, task in enumerate(tasks):
        submitted = (i + 1) * rt.submit_s
        ready = max([submitted] + [ends[d] for d in task.deps])
        best: tuple[float, float, int] | None = None
        for g in range(n_gpus):
            data = max([ready] + [ready_at[t] + min(_transfer_s(rt, tile_bytes[t], s, g)
                                                    if s != g else 0.0 for s in where[t])
                                  for t in task.reads])
            start = max(free[g], data)
            end = start + rt.launch_s + task.exec_s
            if best is None or end < best[1]:
                best = (start, end, g)
        assert best is not None
        start, end, g = best
        free[g] = end
        sched.spans.append((g, start, end))
        sched.busy_s[g] += task.exec_s
        for t in task.reads:
            where[t].add(g)
        where[task.writes] = {g}
        ready_at[task.writes] = end
        ends.append(end)
    return sched

"""Workload kind "collectives": sweep RS / AG / AR / all-to-all sizes, emulated time vs the
closed form.

Each point runs the algorithm and protocol NCCL's model would pick (`comm.cost.choose`, or
`[collectives] algorithm / protocol`) and prints its emulated time beside the closed form of
`comm.cost` (exact for a ring whose ports carry nothing else; the most loaded port's
estimate otherwise), with nccl-tests' algbw and busbw. An all-to-all (`comm.all_to_all`:
NCCL's sends and receives, no tuner choice) of size S sends S / n to every rank, as
nccl-tests' alltoall_perf.
"""
from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
from mpi4py import MPI

from ..comm.all_to_all import all_to_all_v
from ..comm.cost import P2P_ALGORITHM, all_to_all_s, choose, estimate_s
from ..comm.p2p import TimedComm
from ..comm.ring import Reduction
from ..comm.collectives import all_gather, all_reduce, chunk_bounds, reduce_scatter
from ..config.workload import Workload
from ..config.errors import ConfigError
from .context import RankContext


@dataclass(frozen=True)
class SweepPoint:
    """One collective at one size: our emulated time beside the closed form."""

    op: str
    nbytes: int
    ranks: int
    emulated_s: float
    predicted_s: float
    algorithm: str = "ring"
    protocol: str = "simple"

    @property
    def rel_diff(self) -> float:
        return (self.emulated_s - self.predicted_s) / self.predicted_s if self.predicted_s else 0.0

    @property
    def algbw_GBps(self) -> float:
        """nccl-tests' algorithm bandwidth: bytes / time."""
        return self.nbytes / self.emulated_s / 1e9 if self.emulated_s > 0 else 0.0

    @property
    def busbw_GBps(self) -> float:
        """nccl-tests' bus bandwidth: algbw x 2(N-1)/N (all-reduce) or (N-1)/N."""
        return self.algbw_GBps * bus_factor(self.op, self.ranks)


def bus_factor(op: str, n: int) -> float:
    """algbw -> busbw (nccl-tests doc/PERFORMANCE.md)."""
    return (2 if op == "all_reduce" else 1) * (n - 1) / n


def predicted_s(tc: TimedComm, op: str, nbytes: int, itemsize: int, reduce_s: Reduction,
                bidirectional: bool = False) -> tuple[float, str, str]:
    """Closed-form time of the call (`comm.cost`) and the algorithm and protocol it uses."""
    if op == "all_to_all":
        return (all_to_all_s(tc, peer_count(nbytes // itemsize, tc.size, itemsize) * itemsize),
                P2P_ALGORITHM, "simple")
    if tc.size == 1:
        return 0.0, "ring", "simple"
    algo = tc.tuning.algorithm if op == "all_reduce" else ""
    ch = choose(tc, op, nbytes, itemsize, algo, tc.tuning.protocol, bidirectional)
    return (estimate_s(tc, op, nbytes, itemsize, ch, reduce_s, bidirectional), ch.algorithm,
            ch.protocol)


def peer_count(count: int, n: int, itemsize: int) -> int:
    """Elements an all-to-all of `count` sends to each rank: count / n rounded down to 16
    bytes (nccl-tests src/alltoall.cu:19, AlltoAllGetCollByteCount)."""
    per = count // n
    return per & ~(16 // itemsize - 1) if itemsize < 16 else per


def _all_to_all(ctx: RankContext, tc: TimedComm, x: np.ndarray | None, count: int,
                t0: float) -> float:
    """nccl-tests' alltoall: count / n elements to and from every rank."""
    per = peer_count(count, tc.size, ctx.wire_itemsize)
    chunks = None if x is None else [x[j * per:(j + 1) * per] for j in range(tc.size)]
    _, span = all_to_all_v(tc, chunks, [per] * tc.size, [per] * tc.size,
                           itemsize=ctx.wire_itemsize, after=t0)
    return span.t_end


def _run_one(ctx: RankContext, tc: TimedComm, op: str, nbytes: int, t0: float) -> float:
    itemsize = ctx.wire_itemsize
    count = nbytes // itemsize
    x = None
    if ctx.numerics:
        rng = np.random.default_rng(ctx.w.run.seed + tc.rank)
        x = rng.standard_normal(count).astype(ctx.np_dtype)
    if op == "all_to_all":
        return _all_to_all(ctx, tc, x, count, t0)
    if op == "reduce_scatter":
        _, span = reduce_scatter(tc, x, reduce_s=ctx.cost.reduction_s, after=t0, count=count,
                                 wire_itemsize=itemsize,
                                 bidirectional=ctx.w.collectives.bidirectional)
    elif op == "all_gather":
        lo, hi = chunk_bounds(count, tc.size)[tc.rank]
        mine = None if x is None else x[lo:hi]
        _, span = all_gather(tc, mine, total=count, after=t0, count=hi - lo,
                             wire_itemsize=itemsize, bidirectional=ctx.w.collectives.bidirectional)
    else:
        _, span = all_reduce(tc, x, reduce_s=ctx.cost.reduction_s, after=t0, count=count,
                             wire_itemsize=itemsize, bidirectional=ctx.w.collectives.bidirectional)
    return span.t_end


def host_memory_bytes() -> float:
    """Physical memory of this host (what every rank of a one-host job shares)."""
    return float(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def validate(w: Workload, world_size: int) -> None:
    """With numerics on, the largest point's buffers on every rank must fit the host: each
    rank holds its input, its output and ring buffers of a chunk, about 3 copies."""
    if w.run.numerics != "on":
        return
    real = 8 if w.run.numeric_dtype == "fp64" else 4
    biggest = max(w.collectives.size_bytes)
    need = 3 * biggest / ctx_itemsize(w) * real * world_size
    have = host_memory_bytes()
    if need > 0.8 * have:
        raise ConfigError("collectives.sizes", f"{biggest} bytes",
                          f"needs about {need / 2**30:.1f} GiB of host memory with numerics on "
                          f"({world_size} ranks), this host has {have / 2**30:.1f} GiB; use "
                          "run.numerics='off' (same emulated times) or smaller sizes")


def ctx_itemsize(w: Workload) -> int:
    """Bytes per element the model charges (run.emulated_dtype)."""
    from ..devices.specs import dtype_bytes  # noqa: PLC0415
    return dtype_bytes(w.run.emulated_dtype)


def run(ctx: RankContext) -> dict[str, Any]:
    """Sweep every (size, op); all ranks start each point at the same emulated time."""
    cfg = ctx.w.collectives
    tc = ctx.tp if cfg.group == "tp" else ctx.dp
    points: list[SweepPoint] = []
    index = 0
    for nbytes in cfg.size_bytes:
        for op in cfg.ops:
            ctx.maybe_fail(index)
            t0 = ctx.world.allreduce(ctx.tl.now(), op=MPI.MAX)   # align ranks
            with ctx.tl.labelled(iteration=index):
                t_end = _run_one(ctx, tc, op, nbytes, t0)
            t_end = tc.comm.allreduce(t_end, op=MPI.MAX)
            pred, algo, proto = predicted_s(tc, op, nbytes, ctx.wire_itemsize,
                                            ctx.cost.reduction_s, cfg.bidirectional)
            points.append(SweepPoint(op, nbytes, tc.size, t_end - t0, pred, algo, proto))
            index += 1
            ctx.end_iteration()
    _report(ctx, points)
    return {"points": [p.__dict__ for p in points]}


def _report(ctx: RankContext, points: list[SweepPoint]) -> None:
    cfg = ctx.w.collectives
    net = ctx.tp.net
    head = (f"collectives on {points[0].ranks if points else 0} ranks of {ctx.spec.name}, "
            f"network {net.spec.name} ({net.spec.topology}, {net.nodes} node(s) of "
            f"{net.per_node}){' bidirectional' if cfg.bidirectional else ''}")
    lines = [head, f"{'op':<15}{'bytes':>12}{'algo/proto':>20}{'emulated us':>14}"
                   f"{'closed form us':>16}{'diff':>10}{'algbw GB/s':>12}{'busbw GB/s':>12}"]
    for p in points:
        lines.append(f"{p.op:<15}{p.nbytes:>12}{p.algorithm + '/' + p.protocol:>20}"
                     f"{p.emulated_s * 1e6:>14.3f}{p.predicted_s * 1e6:>16.3f}"
                     f"{p.rel_diff:>+10.1e}{p.algbw_GBps:>12.2f}{p.busbw_GBps:>12.2f}")
    ctx.say(*lines)
    if ctx.rank == 0:
        with (ctx.out / "collectives.csv").open("w", newline="") as f:
            wr = csv.writer(f)
            wr.writerow(["op", "bytes", "ranks", "algorithm", "protocol", "emulated_s",
                         "closed_form_s", "algbw_GBps", "busbw_GBps"])
            for p in points:
                wr.writerow([p.op, p.nbytes, p.ranks, p.algorithm, p.protocol,
                             repr(p.emulated_s), repr(p.predicted_s), f"{p.algbw_GBps:.4f}",
                             f"{p.busbw_GBps:.4f}"])

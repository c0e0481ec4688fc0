"""Workload kind "collectives": sweep ring RS / AG / AR sizes, emulated time vs alpha-beta.

The closed form for a unidirectional ring of N ranks, S bytes, largest chunk c = ceil(S/N):
RS = (alpha + c/beta) + (N-2)(alpha + max(c/beta, t_red(c))) + t_red(c): intermediate
reductions stream into the next send, only the last is exposed (thesis 8.5.1.1);
AG = (N-1)(alpha + c/beta); AR = RS + AG. Link-bound, AR = 2(N-1)(alpha + S/(N beta)) +
t_red(S/N) (thesis 2.4.3.1 step counts; alpha-beta form from thesis_models.md 2.4 [EXT]).
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from mpi4py import MPI

from ..comm.p2p import TimedComm
from ..comm.ring import all_gather, all_reduce, chunk_bounds, reduce_scatter
from .config import Workload
from .context import RankContext


@dataclass(frozen=True)
class SweepPoint:
    """One collective at one size: our emulated time beside the closed form."""

    op: str
    nbytes: int
    ranks: int
    emulated_s: float
    predicted_s: float

    @property
    def rel_diff(self) -> float:
        return (self.emulated_s - self.predicted_s) / self.predicted_s if self.predicted_s else 0.0

    @property
    def busbw_GBps(self) -> float:
        """Bus bandwidth: bytes each rank moves over its link per second (NCCL convention)."""
        steps = {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1}[self.op]
        n = self.ranks
        moved = steps * (n - 1) / n * self.nbytes
        return moved / self.emulated_s / 1e9 if self.emulated_s > 0 else 0.0


def predicted_s(tc: TimedComm, op: str, nbytes: int, itemsize: int) -> float:
    """Closed-form alpha-beta time of a contention-free unidirectional ring collective."""
    n = tc.size
    if n == 1:
        return 0.0
    c = math.ceil(nbytes / itemsize / n)
    wire = c * itemsize / tc.link.bw_bytes_per_s
    red = tc.reduce_s(c, itemsize)
    alpha = tc.link.latency_s
    rs = (alpha + wire) + (n - 2) * (alpha + max(wire, red)) + red
    ag = (n - 1) * (alpha + wire)
    return {"reduce_scatter": rs, "all_gather": ag, "all_reduce": rs + ag}[op]


def _run_one(ctx: RankContext, tc: TimedComm, op: str, nbytes: int, t0: float) -> float:
    itemsize = ctx.wire_itemsize
    count = nbytes // itemsize
    x = None
    if ctx.numerics:
        rng = np.random.default_rng(ctx.w.run.seed + tc.rank)
        x = rng.standard_normal(count).astype(ctx.np_dtype)
    if op == "reduce_scatter":
        _, span = reduce_scatter(tc, x, after=t0, count=count, wire_itemsize=itemsize,
                                 bidirectional=ctx.w.collectives.bidirectional)
    elif op == "all_gather":
        lo, hi = chunk_bounds(count, tc.size)[tc.rank]
        mine = None if x is None else x[lo:hi]
        _, span = all_gather(tc, mine, total=count, after=t0, count=hi - lo,
                             wire_itemsize=itemsize, bidirectional=ctx.w.collectives.bidirectional)
    else:
        _, span = all_reduce(tc, x, after=t0, count=count, wire_itemsize=itemsize,
                             bidirectional=ctx.w.collectives.bidirectional)
    return span.t_end


def validate(w: Workload, world_size: int) -> None:
    """Nothing beyond the section's own checks."""


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
            pred = predicted_s(tc, op, nbytes, ctx.wire_itemsize)
            points.append(SweepPoint(op, nbytes, tc.size, t_end - t0, pred))
            index += 1
            ctx.writer.flush()
    _report(ctx, points)
    return {"points": [p.__dict__ for p in points]}


def _report(ctx: RankContext, points: list[SweepPoint]) -> None:
    bidir = ctx.w.collectives.bidirectional
    head = (f"ring collectives on {points[0].ranks if points else 0} ranks, "
            f"{ctx.spec.name} link {ctx.tp.link.bw_bytes_per_s / 1e9:g} GB/s per direction, "
            f"{ctx.tp.link.latency_s * 1e9:g} ns{' (bidirectional)' if bidir else ''}")
    lines = [head, f"{'op':<15}{'bytes':>12}{'emulated us':>14}{'alpha-beta us':>15}"
                   f"{'diff':>10}{'busbw GB/s':>12}"]
    for p in points:
        pred = "-" if bidir else f"{p.predicted_s * 1e6:.3f}"
        diff = "-" if bidir else f"{p.rel_diff:+.1e}"
        lines.append(f"{p.op:<15}{p.nbytes:>12}{p.emulated_s * 1e6:>14.3f}{pred:>15}"
                     f"{diff:>10}{p.busbw_GBps:>12.2f}")
    ctx.say(*lines)
    if ctx.rank == 0:
        with (ctx.out / "collectives.csv").open("w", newline="") as f:
            wr = csv.writer(f)
            wr.writerow(["op", "bytes", "ranks", "emulated_s", "alpha_beta_s", "busbw_GBps"])
            for p in points:
                wr.writerow([p.op, p.nbytes, p.ranks, repr(p.emulated_s), repr(p.predicted_s),
                             f"{p.busbw_GBps:.4f}"])

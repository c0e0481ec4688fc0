"""Ring all-gather of row shards, alone or fused with its consumer GEMM.

Alone: the all-gather that follows a reduce-scatter (AR = RS + AG, thesis 8.4.3) or precedes
a column-parallel GEMM (sequential). Fused ("collective matmul", thesis 8.6.2 "TP with
all-gather"; overlap_software.md 5.2): at step s a rank multiplies the shard it holds while
forwarding it and receiving the next; a GEMM stage may start once the rows it reads have
arrived (the Tracker triggers workgroups instead of DMAs). Each output row block depends on
one input block only, so the result is exact: no reduction, no order to match.
"""
from __future__ import annotations

import math

import numpy as np

from ..comm import lanes as sch
from ..comm.p2p import Call, TimedComm
from ..devices.cost import DeviceCost
from ..comm.ring import AllGather, ring_lanes, ring_pieces
from ..comm.lanes import chunk_bounds
from ..devices.contention import NO_CONTENTION, T3Params
from ..sim.timeline import COMPUTE
from .clock import Clock
from .costs import OverlapStats, RingCosts, ag_costs, arbitration, comm_cus, gemm_plan
from .rs import lane_rate, pieces_per_chunk
from .strategy import Overlap

class ClockGather:
    """The all-gather's side of the ring (`comm.ring.RingHooks`): the own shard exists at
    `start`; each send is timed by the clock (DRAM shared with a concurrent GEMM)."""

    def __init__(self, tc: TimedComm, call: Call, clock: Clock, ring_costs: RingCosts,
                 start: float) -> None:
        self.tc, self.call, self.clock = tc, call, clock
        self.ring_costs, self.start = ring_costs, start

    def ready(self, p: sch.Piece) -> float:
        return self.start

    def place(self, p: sch.Piece, dst: int, ready: float, nbytes: float) -> np.ndarray:
        return self.clock.send(self.tc, self.call, dst, ready, nbytes, self.ring_costs.steady,
                               step=p.step, label="ag.send", stat="ag")

    def received(self, p: sch.Piece, nbytes: float) -> None:
        self.clock.account("ag", nbytes, self.ring_costs.incoming)

    def finish(self, p: sch.Piece, t: float) -> float:
        return t                          # an all-gather reduces nothing

    def local(self, p: sch.Piece) -> np.ndarray | None:
        return None


def ring_all_gather(tc: TimedComm, cost: DeviceCost, call: Call, mine: np.ndarray | None, *,
                    m: int, n: int, itemsize: int, start: float, ov: Overlap, name: str,
                    stats: OverlapStats,
                    out: np.ndarray | None = None) -> tuple[np.ndarray | None, float, float]:
    """Rows of every rank in rank order (into `out` if given); returns (full [m, n] or None,
    first send, end)."""
    ls = ring_lanes(tc, m, ov.bidirectional)
    costs = ag_costs(ov)
    clock = Clock(tc.tl, name, cost.spec.dram_stream_bw, NO_CONTENTION, costs,
                  lane_rate(tc, call, ls), len(ls), stats=stats)
    full = None
    if mine is not None:
        full = np.empty((m, n), mine.dtype) if out is None else out
        lo, hi = chunk_bounds(m, tc.size)[tc.rank]
        full[lo:hi] = mine
    ring = AllGather(tc, ls, ring_pieces(tc, m, ov.bidirectional, 1, "ag"), n, itemsize,
                     ClockGather(tc, call, clock, costs, start), full).run()
    end = ring.end
    first = min(ring.first_send, end)
    stats.ag_s += end - first
    return full, first, end


class AgGemm:
    """All-gather -> column-parallel GEMM on one rank, fused or not."""

    def __init__(self, tc: TimedComm, cost: DeviceCost, call: Call, ov: Overlap, m: int,
                 n: int, k: int, dtype: str, itemsize: int, after: float,
                 params: T3Params | None, stats: OverlapStats, name: str) -> None:
        self.tc, self.call, self.ov, self.m, self.n, self.k = tc, call, ov, m, n, k
        self.itemsize, self.stats, self.name = itemsize, stats, name
        spec = cost.spec
        cus = comm_cus(ov, spec.compute_units)
        self.plan = gemm_plan(cost, m, n, k, dtype,
                              compute_units=None if cus is None else spec.compute_units - cus)
        self.lanes = ring_lanes(tc, m, ov.bidirectional)
        parts = pieces_per_chunk(ov, self.plan.n_stages, tc.size, len(self.lanes))
        self.pieces = ring_pieces(tc, m, ov.bidirectional, parts, "ag")
        self.ring_costs = ag_costs(ov)
        bw = spec.dram_stream_bw
        cu_bw = math.inf if cus is None or params is None else cus * params.comm_cu_bw_bytes_per_s
        self.after = after                       # the own shard exists from here
        self.t0 = max(after, tc.tl.free_at(COMPUTE))
        self.clock = Clock(tc.tl, name, bw, arbitration(ov, params, self.plan, bw),
                           self.ring_costs, lane_rate(tc, call, self.lanes), len(self.lanes),
                           cu_bw, self.plan, self.t0, stats=stats)
        stats.n_stages = self.plan.n_stages
        stats.gemm_isolated_s = self.plan.time_s

    def run(self, x_shard: np.ndarray | None, w: np.ndarray | None,
            out: np.ndarray | None = None) -> tuple[np.ndarray | None, float, float, float]:
        """Gather piece by piece (into `out` if given), multiply each lane chunk once its rows
        are here. Returns (y or None, first transfer start, last arrival, end of the GEMM).
        """
        tc, size, r = self.tc, self.tc.size, self.tc.rank
        real = x_shard is not None and w is not None
        xfull = y = None
        if real:
            xfull = np.empty((self.m, self.k), np.result_type(x_shard)) if out is None else out
            lo, hi = chunk_bounds(self.m, size)[r]
            xfull[lo:hi] = x_shard
            y = np.empty((self.m, self.n), np.result_type(x_shard, w))
        ring = AllGather(tc, self.lanes, self.pieces, self.k, self.itemsize,
                         ClockGather(tc, self.call, self.clock, self.ring_costs, self.after),
                         xfull)
        ring.run(None if not real else
                 lambda s: self._multiply(s, xfull, w, y))  # type: ignore[arg-type]
        arrive = ring.arrive
        end = self._time_gemm(arrive)
        comm_end = max(arrive.values())
        first = min(ring.first_send, comm_end)
        self.stats.ag_s += comm_end - first
        return y, first, comm_end, end

    def _multiply(self, step: int, xfull: np.ndarray, w: np.ndarray, y: np.ndarray) -> None:
        """y rows of every lane chunk held at `step` (one GEMM per lane chunk)."""
        for lane in self.lanes:
            lo, hi = lane.bounds[lane.ag_owner(self.tc.rank, step)]
            np.matmul(xfull[lo:hi], w, out=y[lo:hi])

    def _time_gemm(self, arrive: dict[tuple[int, int, int], float]) -> float:
        """Stages start once every row they read has arrived (and the previous one ended)."""
        pieces = sorted(self.pieces, key=lambda p: p.pos0)
        for i, wave in enumerate(self.plan.waves):
            needed = [arrive[(p.lane, p.step, p.index)] for p in pieces
                      if p.pos0 < wave.pos1 - 1e-12 and p.n_rows > 0]
            self.clock.gate[i] = max(needed, default=self.after)
        return self.clock.gemm_end()

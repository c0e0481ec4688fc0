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
from mpi4py import MPI

from ..comm import schedule as sch
from ..comm.p2p import TimedComm
from ..comm.ring import ring_orders
from ..comm.schedule import chunk_bounds
from ..hw.contention import NO_CONTENTION, T3Params
from ..sim.timeline import COMPUTE
from .clock import Clock
from .model import OverlapStats, ag_costs, arbitration, comm_cus, gemm_plan
from .rs import lane_rate, pieces_per_chunk
from .strategy import Overlap

TAG_AG, TAG_AGG = 410, 420


def ring_all_gather(tc: TimedComm, mine: np.ndarray | None, *, m: int, n: int, itemsize: int,
                    start: float, ov: Overlap, name: str, stats: OverlapStats,
                    out: np.ndarray | None = None) -> tuple[np.ndarray | None, float, float]:
    """Rows of every rank in rank order (into `out` if given); returns (full [m, n] or None,
    first send, end)."""
    size, r = tc.size, tc.rank
    ls = sch.lanes(m, ring_orders(tc, ov.bidirectional))
    costs = ag_costs(ov)
    clock = Clock(tc.tl, name, tc.model.spec.dram_stream_bw, NO_CONTENTION, costs,
                  lane_rate(tc, ls), len(ls), stats=stats)
    full = None
    if mine is not None:
        full = np.empty((m, n), mine.dtype) if out is None else out
        lo, hi = chunk_bounds(m, size)[r]
        full[lo:hi] = mine
    have = [start] * len(ls)
    first, reqs = math.inf, []
    for s in range(size - 1):
        posted = []
        for lane in ls:
            dst, src = lane.peers(r)
            slo, shi = lane.bounds[lane.ag_owner(r, s)]
            rlo, rhi = lane.bounds[lane.ag_owner(r, s + 1)]
            nbytes = (shi - slo) * n * itemsize
            h = tc.irecv(None if full is None else full[rlo:rhi], src, TAG_AG + lane.index, 0.0)
            header = clock.send(tc, dst, have[lane.index], nbytes, costs.steady, step=s,
                                label="ag.send", stat="ag")
            first = min(first, float(header[0]))
            reqs += tc.post(header, None if full is None else full[slo:shi], dst,
                            TAG_AG + lane.index)
            posted.append((lane, h, (rhi - rlo) * n * itemsize))
        for lane, h, nbytes in posted:
            MPI.Request.Waitall(h.reqs)
            clock.account("ag", nbytes, costs.incoming)
            have[lane.index] = h.t_arrive
    MPI.Request.Waitall(reqs)
    end = max(have)
    stats.ag_s += end - min(first, end)
    return full, min(first, end), end


class AgGemm:
    """All-gather -> column-parallel GEMM on one rank, fused or not."""

    def __init__(self, tc: TimedComm, ov: Overlap, m: int, n: int, k: int, dtype: str,
                 itemsize: int, after: float, params: T3Params | None, stats: OverlapStats,
                 name: str) -> None:
        self.tc, self.ov, self.m, self.n, self.k = tc, ov, m, n, k
        self.itemsize, self.stats, self.name = itemsize, stats, name
        spec = tc.model.spec
        cus = comm_cus(ov, spec.compute_units)
        self.plan = gemm_plan(tc.model, m, n, k, dtype,
                              compute_units=None if cus is None else spec.compute_units - cus)
        self.lanes = sch.lanes(m, ring_orders(tc, ov.bidirectional))
        parts = pieces_per_chunk(ov, self.plan.n_stages, tc.size, len(self.lanes))
        self.pieces = sch.plan(tc.rank, m, self.lanes, parts, "ag")
        self.costs = ag_costs(ov)
        bw = spec.dram_stream_bw
        cu_bw = math.inf if cus is None or params is None else cus * params.comm_cu_bw_bytes_per_s
        self.after = after                       # the own shard exists from here
        self.t0 = max(after, tc.tl.free_at(COMPUTE))
        self.clock = Clock(tc.tl, name, bw, arbitration(ov, params, self.plan, bw), self.costs,
                           lane_rate(tc, self.lanes), len(self.lanes), cu_bw, self.plan,
                           self.t0, stats=stats)
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
        arrive: dict[tuple[int, int, int], float] = {}
        recvs, reqs, first = {}, [], math.inf
        for s in range(size):
            if s + 1 < size:
                for p in (q for q in self.pieces if q.step == s + 1):
                    lane = self.lanes[p.lane]
                    buf = None if xfull is None else xfull[p.rows[0]:p.rows[1]]
                    recvs[(p.lane, p.step, p.index)] = tc.irecv(
                        buf, lane.peers(r)[1], TAG_AGG + p.lane, 0.0)
            for p in (q for q in self.pieces if q.step == s):
                key = (p.lane, p.step, p.index)
                nbytes = p.n_rows * self.k * self.itemsize
                if s == 0:
                    arrive[key] = self.after
                else:
                    h = recvs.pop(key)
                    MPI.Request.Waitall(h.reqs)
                    self.clock.account("ag", nbytes, self.costs.incoming)
                    arrive[key] = h.t_arrive
                if s + 1 < size:         # forward the shard while the GEMM consumes it
                    lane = self.lanes[p.lane]
                    dst = lane.peers(r)[0]
                    header = self.clock.send(tc, dst, arrive[key], nbytes, self.costs.steady,
                                             step=s, label="ag.send", stat="ag")
                    first = min(first, float(header[0]))
                    reqs += tc.post(header, None if xfull is None else
                                    xfull[p.rows[0]:p.rows[1]], dst, TAG_AGG + p.lane)
            if real:
                self._multiply(s, xfull, w, y)  # type: ignore[arg-type]
        MPI.Request.Waitall(reqs)
        end = self._time_gemm(arrive)
        comm_end = max(arrive.values())
        first = min(first, comm_end)
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

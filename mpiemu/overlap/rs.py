"""Row-parallel GEMM -> ring reduce-scatter, fused or not (thesis 8.3, Fig. 8.5; 8.4.3).

Fused (sw-overlap, t3, t3-mca): each rank computes its output chunk by chunk in the order
the ring consumes them (the chunk that leaves first first, its own chunk last). Step 0's
chunk goes straight to the next rank (T3: `remote_update`); at step s >= 1 the incoming
partial of the chunk just computed is added to it and forwarded once both are complete
(track & trigger), piece by piece. Non-fused (sequential, ideal, ideal+nmc): the whole GEMM
first, then the ring (sequential waits for the GEMM; ideal does not, thesis 8.4.3).
Numerics: local + received in the ring's order, so the result equals the order-matched
reference bit for bit (`reference.gemm_rs_reference`). x = w = None: timing only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from ..comm import schedule as sch
from ..comm.p2p import RecvHandle, TimedComm
from ..comm.ring import ring_orders
from ..comm.schedule import chunk_bounds
from ..hw.contention import T3Params
from ..sim.timeline import COMPUTE
from .clock import Clock
from .model import GemmPlan, OverlapStats, RingCosts, arbitration, comm_cus, gemm_plan, rs_costs
from .strategy import Overlap

TAG_RS = 400


@dataclass
class RsSetup:
    """Everything one call decides before any message moves."""

    tc: TimedComm
    ov: Overlap
    m: int
    n: int
    itemsize: int
    lanes: list[sch.Lane]
    pieces: list[sch.Piece]
    costs: RingCosts
    clock: Clock
    plan: GemmPlan
    t0: float                          # when the GEMM may start
    ready_all: float = math.nan        # non-fused: when every partial is available


def lane_rate(tc: TimedComm, ls: list[sch.Lane]) -> float:
    """The slowest rate of this rank's hops on the lanes (bytes/s, the network's)."""
    return min(tc.rate(ln.peers(tc.rank)[0]) for ln in ls)


def pieces_per_chunk(ov: Overlap, n_stages: int, size: int, n_lanes: int) -> int:
    """Sub-chunks per lane chunk: as asked, or about one per GEMM stage (Tracker, 8.3.2)."""
    if not ov.traits.fused:
        return 1
    if ov.pieces:
        return ov.pieces
    return max(1, math.ceil(n_stages / (size * n_lanes)))


def setup(tc: TimedComm, ov: Overlap, m: int, n: int, k: int, dtype: str, itemsize: int,
          after: float, params: T3Params | None, stats: OverlapStats, name: str) -> RsSetup:
    """Plan the GEMM stages, the ring pieces and the clock that times them."""
    t, spec = ov.traits, tc.model.spec
    cus = comm_cus(ov, spec.compute_units)
    plan = gemm_plan(tc.model, m, n, k, dtype, uncached_output=t.uncached_output,
                     compute_units=None if cus is None else spec.compute_units - cus)
    ls = sch.lanes(m, ring_orders(tc, ov.bidirectional))
    parts = pieces_per_chunk(ov, plan.n_stages, tc.size, len(ls))
    pieces = sch.plan(tc.rank, m, ls, parts, "rs")
    # only the NMC strategies read the update cost, and they require the parameters
    costs = rs_costs(ov, params.nmc_update_cost if params is not None else 1.0)
    bw = spec.dram_stream_bw
    arb = arbitration(ov, params, plan, bw)
    cu_bw = math.inf if cus is None or params is None else cus * params.comm_cu_bw_bytes_per_s
    t0 = max(after, tc.tl.free_at(COMPUTE))
    clock = Clock(tc.tl, name, bw, arb, costs, lane_rate(tc, ls), len(ls), cu_bw,
                  plan if t.fused else None, t0, stats=stats)
    if t.fused:
        clock.uncached_output = t.uncached_output
        _fused_stage_traffic(clock, plan, pieces, costs, m * n * itemsize, t.nmc)
    stats.n_stages = plan.n_stages
    stats.gemm_isolated_s = plan.time_s
    if arb.policy == "compute-first" and params is not None:
        stats.mca_threshold = params.mca_threshold(plan.read_intensity(bw))
    return RsSetup(tc, ov, m, n, itemsize, ls, pieces, costs, clock, plan, t0)


def _fused_stage_traffic(clock: Clock, plan: GemmPlan, pieces: list[sch.Piece],
                         costs: RingCosts, out_bytes: float, remote_first: bool) -> None:
    """Per stage: share of output written locally, its cost, incoming remote updates."""
    first_end = max((p.pos1 for p in pieces if p.step == 0), default=0.0)
    for i, w in enumerate(plan.waves):
        remote = max(0.0, min(w.pos1, first_end) - w.pos0) / max(w.pos1 - w.pos0, 1e-300)
        clock.write_cost[i] = costs.write_cost
        if remote_first:     # step 0 leaves by remote stores; the neighbour's arrive likewise
            clock.write_local[i] = 1.0 - remote
            clock.attached[i] = remote * (w.pos1 - w.pos0) * out_bytes * costs.incoming.cost


def place_gemm(s: RsSetup, stats: OverlapStats, name: str, start: float) -> float:
    """The whole GEMM as one compute op (non-fused strategies); returns its end."""
    c = s.plan.cost
    end = start + c.time_s
    s.tc.tl.place(f"{name}.gemm", [COMPUTE], start, end, cat="compute", flops=c.flops,
                  dram_bytes=c.dram_bytes, stage=c.n_stages)
    stats.gemm_s += c.time_s
    stats.add("gemm_read", c.dram_read_bytes)
    stats.add("gemm_write", c.dram_write_bytes)
    return end


class RsRun:
    """One rank's pass over its pieces: numerics and emulated time side by side."""

    def __init__(self, s: RsSetup, x: np.ndarray | None, w: np.ndarray | None,
                 y: np.ndarray | None, name: str) -> None:
        self.s, self.x, self.w, self.y, self.name = s, x, w, y, name
        tc, size = s.tc, s.tc.size
        self.real = x is not None and w is not None
        dt = np.result_type(x, w) if self.real else np.float64
        width = max((hi - lo for lane in s.lanes for lo, hi in lane.bounds), default=0)

        def pair(needed: bool) -> list[list[np.ndarray]]:
            """Two buffers per lane (by step parity); none in timing-only mode."""
            rows = width if needed and self.real else 0
            return [[np.empty((rows, s.n), dt) for _ in (0, 1)] for _ in s.lanes]

        self.part = pair(y is None)          # fused: this step's partials, being sent
        self.rbuf = pair(True)               # partials arriving from the previous rank
        self.sreqs: list[list[list[MPI.Request]]] = [[[], []] for _ in s.lanes]
        self.recvs: dict[tuple[int, int, int], RecvHandle] = {}
        own = chunk_bounds(s.m, size)[tc.rank]
        self.out = np.empty((own[1] - own[0], s.n), dt) if self.real else None
        self.own_lo = own[0]
        self.first_send = math.inf
        self.done = -math.inf

    def run(self) -> None:
        """All pieces in execution order; every request completed before returning."""
        size = self.s.tc.size
        for p in self.s.pieces:
            if p.lane == 0 and p.index == 0 and p.step + 1 < size:
                self._post(p.step + 1)
            local = self._local(p)
            if p.step == 0:
                self._send(p, local, self._ready(p))
            else:
                self._combine(p, local)
        for lane in self.sreqs:
            for reqs in lane:
                MPI.Request.Waitall(reqs)

    # ---- data --------------------------------------------------------------------------
    def _local(self, p: sch.Piece) -> np.ndarray | None:
        """This rank's partial of the piece's rows (computing the lane chunk when it starts)."""
        if not self.real:
            return None
        lane = self.s.lanes[p.lane]
        lo, hi = lane.bounds[p.chunk]
        if self.y is not None:
            return self.y[p.rows[0]:p.rows[1]]
        buf = self.part[p.lane][p.step % 2]
        if p.index == 0:
            # the sends from this buffer two steps ago must finish before it is overwritten
            MPI.Request.Waitall(self.sreqs[p.lane][p.step % 2])
            self.sreqs[p.lane][p.step % 2] = []
            assert self.x is not None and self.w is not None      # self.real
            np.matmul(self.x[lo:hi], self.w, out=buf[:hi - lo])
        return buf[p.rows[0] - lo:p.rows[1] - lo]

    def _post(self, step: int) -> None:
        """Post the receives of a step early so the data can flow during the GEMM."""
        tc, s = self.s.tc, self.s
        for p in s.pieces:
            if p.step != step:
                continue
            lane = s.lanes[p.lane]
            lo = lane.bounds[p.chunk][0]
            buf = None
            if self.real:
                buf = self.rbuf[p.lane][step % 2][p.rows[0] - lo:p.rows[1] - lo]
            src = lane.peers(tc.rank)[1]
            self.recvs[(p.lane, p.step, p.index)] = tc.irecv(buf, src, TAG_RS + p.lane, 0.0)

    # ---- time --------------------------------------------------------------------------
    def _ready(self, p: sch.Piece) -> float:
        """When this rank's own partial of the piece exists in memory."""
        s = self.s
        if s.ov.traits.fused:
            return s.clock.stage_end(s.plan.wave_of(p.pos1))
        return s.ready_all

    def _nbytes(self, p: sch.Piece) -> float:
        return p.n_rows * self.s.n * self.s.itemsize

    def _send(self, p: sch.Piece, data: np.ndarray | None, ready: float) -> None:
        s, tc = self.s, self.s.tc
        dst = s.lanes[p.lane].peers(tc.rank)[0]
        bc, streamed = (s.costs.first, -math.inf) if p.step == 0 else (s.costs.steady, -math.inf)
        if p.step == 0 and s.ov.traits.fused and s.ov.traits.nmc:      # remote_update
            k = s.plan.wave_of(p.pos1)
            ready, streamed = s.clock.stage_start(k), s.clock.stage_end(k)
        header = s.clock.send(tc, dst, ready, self._nbytes(p), bc, step=p.step,
                              label="rs.send", stat="rs", streamed_until=streamed)
        self.first_send = min(self.first_send, float(header[0]))
        self.sreqs[p.lane][p.step % 2].extend(tc.post(header, data, dst, TAG_RS + p.lane))

    def _combine(self, p: sch.Piece, local: np.ndarray | None) -> None:
        """Add the incoming partial (local + received) and forward it, or keep the result."""
        s, tc = self.s, self.s.tc
        h = self.recvs.pop((p.lane, p.step, p.index))
        MPI.Request.Waitall(h.reqs)
        s.clock.account("rs", self._nbytes(p), s.costs.incoming)
        t = max(self._ready(p), h.t_arrive)
        last = p.step == tc.size - 1
        if local is not None:
            lane_lo = s.lanes[p.lane].bounds[p.chunk][0]
            recv = self.rbuf[p.lane][p.step % 2][p.rows[0] - lane_lo:p.rows[1] - lane_lo]
            if last:
                dst = self.out[p.rows[0] - self.own_lo:p.rows[1] - self.own_lo]  # type: ignore[index]
                np.add(local, recv, out=dst)
            else:
                np.add(local, recv, out=local)
        if not last:
            self._send(p, local, t)
            return
        if s.ov.traits.nmc:            # the updates landed reduced: nothing left to do
            self.done = max(self.done, t)
            return
        n_elems = p.n_rows * s.n
        iso = tc.model.reduction_s(n_elems, s.itemsize)
        self.done = max(self.done, s.clock.reduce(tc.stream, t, self._nbytes(p), n_elems, iso,
                                                  step=p.step, label="rs.reduce", stat="rs"))

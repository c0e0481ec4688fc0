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

from ..comm import lanes as sch
from ..comm.p2p import Call, TimedComm
from ..devices.cost import DeviceCost
from ..comm.ring import ReduceScatter, ring_lanes, ring_pieces
from ..comm.lanes import chunk_bounds
from ..devices.contention import T3Params
from ..sim.timeline import COMPUTE
from .clock import Clock
from .costs import GemmPlan, OverlapStats, RingCosts, arbitration, comm_cus, gemm_plan, rs_costs
from .strategy import Overlap

@dataclass
class RsSetup:
    """Everything one call decides before any message moves."""

    tc: TimedComm
    cost: DeviceCost                   # the device's: the GEMM and the last reduction
    call: Call                         # the ring's protocol and channel share
    ov: Overlap
    m: int
    n: int
    itemsize: int
    lanes: list[sch.Lane]
    pieces: list[sch.Piece]
    ring_costs: RingCosts
    clock: Clock
    plan: GemmPlan
    t0: float                          # when the GEMM may start
    ready_all: float = math.nan        # non-fused: when every partial is available


def lane_rate(tc: TimedComm, call: Call, ls: list[sch.Lane]) -> float:
    """The slowest rate of this rank's hops on the lanes (bytes/s, the network's)."""
    return min(tc.rate(ln.peers(tc.rank)[0], call) for ln in ls)


def pieces_per_chunk(ov: Overlap, n_stages: int, size: int, n_lanes: int) -> int:
    """Sub-chunks per lane chunk: as asked, or about one per GEMM stage (Tracker, 8.3.2)."""
    if not ov.traits.fused:
        return 1
    if ov.pieces:
        return ov.pieces
    return max(1, math.ceil(n_stages / (size * n_lanes)))


def setup(tc: TimedComm, cost: DeviceCost, call: Call, ov: Overlap, m: int, n: int, k: int,
          dtype: str, itemsize: int, after: float, params: T3Params | None,
          stats: OverlapStats, name: str) -> RsSetup:
    """Plan the GEMM stages, the ring pieces and the clock that times them."""
    t, spec = ov.traits, cost.spec
    cus = comm_cus(ov, spec.compute_units)
    plan = gemm_plan(cost, m, n, k, dtype, uncached_output=t.uncached_output,
                     compute_units=None if cus is None else spec.compute_units - cus)
    ls = ring_lanes(tc, m, ov.bidirectional)
    parts = pieces_per_chunk(ov, plan.n_stages, tc.size, len(ls))
    pieces = ring_pieces(tc, m, ov.bidirectional, parts, "rs")
    # only the NMC strategies read the update cost, and they require the parameters
    costs = rs_costs(ov, params.nmc_update_cost if params is not None else 1.0)
    bw = spec.dram_stream_bw
    arb = arbitration(ov, params, plan, bw)
    cu_bw = math.inf if cus is None or params is None else cus * params.comm_cu_bw_bytes_per_s
    t0 = max(after, tc.tl.free_at(COMPUTE))
    clock = Clock(tc.tl, name, bw, arb, costs, lane_rate(tc, call, ls), len(ls), cu_bw,
                  plan if t.fused else None, t0, stats=stats)
    if t.fused:
        clock.uncached_output = t.uncached_output
        _fused_stage_traffic(clock, plan, pieces, costs, m * n * itemsize, t.nmc)
    stats.n_stages = plan.n_stages
    stats.gemm_isolated_s = plan.time_s
    if arb.policy == "compute-first" and params is not None:
        stats.mca_threshold = params.mca_threshold(plan.read_intensity(bw))
    return RsSetup(tc, cost, call, ov, m, n, itemsize, ls, pieces, costs, clock, plan, t0)


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


class RsHooks:
    """The GEMM's side of the ring (`comm.ring.RingHooks`): a piece's partial exists when
    the GEMM stage that writes it ends (fused) or when the whole GEMM does (non-fused); its
    send is timed by the clock (DRAM shared with the GEMM); the last step's sum is reduced
    on the communication stream, or has already landed reduced (near-memory, NMC)."""

    def __init__(self, s: RsSetup, x: np.ndarray | None, w: np.ndarray | None,
                 y: np.ndarray | None) -> None:
        self.s, self.x, self.w, self.y = s, x, w, y
        self.real = x is not None and w is not None
        dt = np.result_type(x, w) if self.real else np.float64
        rows = max((hi - lo for lane in s.lanes for lo, hi in lane.bounds), default=0)
        rows = rows if self.real and y is None else 0
        self.part = [[np.empty((rows, s.n), dt) for _ in (0, 1)] for _ in s.lanes]

    def ready(self, p: sch.Piece) -> float:
        s = self.s
        if s.ov.traits.fused:
            return s.clock.stage_end(s.plan.wave_of(p.pos1))
        return s.ready_all

    def place(self, p: sch.Piece, dst: int, ready: float, nbytes: float) -> np.ndarray:
        s = self.s
        bc, streamed = (s.ring_costs.first if p.step == 0 else s.ring_costs.steady), -math.inf
        if p.step == 0 and s.ov.traits.fused and s.ov.traits.nmc:      # remote_update
            k = s.plan.wave_of(p.pos1)
            ready, streamed = s.clock.stage_start(k), s.clock.stage_end(k)
        return s.clock.send(s.tc, s.call, dst, ready, nbytes, bc, step=p.step, label="rs.send",
                            stat="rs", streamed_until=streamed)

    def received(self, p: sch.Piece, nbytes: float) -> None:
        self.s.clock.account("rs", nbytes, self.s.ring_costs.incoming)

    def finish(self, p: sch.Piece, t: float) -> float:
        s = self.s
        if s.ov.traits.nmc:            # the updates landed reduced: nothing left to do
            return t
        n_elems = p.n_rows * s.n
        iso = s.cost.reduction_s(n_elems, s.itemsize)
        return s.clock.reduce(s.tc.stream, t, n_elems * s.itemsize, n_elems, iso,
                              step=p.step, label="rs.reduce", stat="rs")

    def local(self, p: sch.Piece) -> np.ndarray | None:
        """This rank's partial of the piece's rows (computing the lane chunk when it starts:
        the ring has released that buffer's earlier sends)."""
        if not self.real:
            return None
        if self.y is not None:
            return self.y[p.rows[0]:p.rows[1]]
        lo, hi = self.s.lanes[p.lane].bounds[p.chunk]
        buf = self.part[p.lane][p.step % 2]
        if p.index == 0:
            assert self.x is not None and self.w is not None      # self.real
            np.matmul(self.x[lo:hi], self.w, out=buf[:hi - lo])
        return buf[p.rows[0] - lo:p.rows[1] - lo]


def run(s: RsSetup, x: np.ndarray | None, w: np.ndarray | None, y: np.ndarray | None
        ) -> tuple[ReduceScatter, np.ndarray | None]:
    """One rank's pass over its pieces: the ring with the GEMM's hooks; returns the run
    (first send, end) and this rank's rows of the result (numerics on)."""
    hooks = RsHooks(s, x, w, y)
    tc = s.tc
    own = chunk_bounds(s.m, tc.size)[tc.rank]
    dt = np.result_type(x, w) if hooks.real else None
    out = np.empty((own[1] - own[0], s.n), dt) if dt is not None else None
    ring = ReduceScatter(tc, s.lanes, s.pieces, s.n, s.itemsize, hooks, dtype=dt, out=out,
                         own_lo=own[0], writable=True).run()
    return ring, out

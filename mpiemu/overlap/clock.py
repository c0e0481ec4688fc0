"""Emulated time of one rank while a GEMM's stages and ring transfers overlap (no MPI here).

The clock places the GEMM stage by stage on the compute stream and ring transfers on the
link streams. While they overlap they share DRAM (`devices.contention`): a stage lasts longer
when communication traffic lands in it; a transfer is slower when the DRAM share left to
communication (or the CUs of a communication kernel) cannot feed the link.
Incoming traffic is not known ahead of the messages, so the clock uses the ring's symmetry
as the thesis's simulator does (8.4.1.1): every rank receives what it sends, when it sends
it, so each outgoing transfer also stands for the incoming one (`RingCosts.incoming`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..comm.p2p import Call, TimedComm
from ..devices.contention import Arbitration, StageDemand, comm_dram_bw, solve_stage
from ..sim.timeline import COMPUTE, Timeline
from .costs import ByteCost, GemmPlan, OverlapStats, RingCosts


@dataclass
class Flow:
    """A transfer's DRAM footprint on this rank: cost bytes spread over [t0, t1]."""

    t0: float
    t1: float
    cost_bytes: float

    def within(self, a: float, b: float) -> float:
        """Cost bytes that fall inside [a, b] (uniform over the flow)."""
        if self.t1 <= self.t0:
            return self.cost_bytes if a <= self.t0 <= b else 0.0
        over = min(b, self.t1) - max(a, self.t0)
        return self.cost_bytes * over / (self.t1 - self.t0) if over > 0 else 0.0


@dataclass
class Clock:
    """GEMM stages on the compute stream, ring transfers on the links, DRAM shared between."""

    tl: Timeline
    name: str
    bw: float                          # DRAM streaming bandwidth (bytes/s)
    arb: Arbitration
    costs: RingCosts
    link_bw: float                     # the network's rate on this rank's hop (bytes/s)
    lanes: int                         # lanes transferring at once (1, or 2 bidirectional)
    cu_bw: float = math.inf            # loads+stores/s of the communication kernel's CUs (inf: DMA)
    plan: GemmPlan | None = None
    start: float = 0.0
    write_cost: list[float] = field(default_factory=list)   # DRAM cost per local output byte
    write_local: list[float] = field(default_factory=list)  # share of a stage's output kept locally
    uncached_output: bool = False      # output stores go to DRAM, not the LLC (T3, 8.3.3)
    attached: list[float] = field(default_factory=list)     # comm cost bytes inside each stage
    gate: list[float] = field(default_factory=list)         # earliest start of each stage
    stats: OverlapStats | None = None
    flows: list[Flow] = field(default_factory=list)
    starts: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.plan.waves) if self.plan else 0
        for name, default in (("write_cost", 1.0), ("write_local", 1.0), ("attached", 0.0),
                              ("gate", 0.0)):
            if not getattr(self, name):
                setattr(self, name, [default] * n)
        self._cursor = self.start
        self._demand: float | None = None

    # ---- the GEMM ----------------------------------------------------------------------
    def stage_end(self, k: int) -> float:
        """End of GEMM stage k, placing the stages up to it."""
        while len(self.ends) <= k:
            self._run_stage(len(self.ends))
        return self.ends[k]

    def stage_start(self, k: int) -> float:
        self.stage_end(k)
        return self.starts[k]

    def gemm_end(self) -> float:
        assert self.plan is not None
        return self.stage_end(len(self.plan.waves) - 1)

    def _run_stage(self, k: int) -> None:
        """Place stage k: isolated time stretched by the communication that overlaps it."""
        assert self.plan is not None and self.stats is not None
        w = self.plan.waves[k]
        t0 = max(self._cursor, self.gate[k], self.tl.free_at(COMPUTE))
        local_w = w.write_bytes * self.write_local[k]
        critical = w.read_bytes + (local_w if self.uncached_output else 0.0)
        demand = StageDemand(w.time_s, w.read_bytes, local_w * self.write_cost[k], critical)
        dur, _ = solve_stage(demand, lambda d: self.comm_cost(t0, t0 + d) + self.attached[k],
                             self.arb, self.bw)
        self.tl.place(f"{self.name}.gemm", [COMPUTE], t0, t0 + dur, cat="compute",
                      flops=w.flops, dram_bytes=w.read_bytes + local_w,
                      stage=self.plan.n_stages)
        self.stats.gemm_s += dur
        self.stats.add("gemm_read", w.read_bytes)
        self.stats.add("gemm_write", local_w)
        self.starts.append(t0)
        self.ends.append(t0 + dur)
        self._cursor = t0 + dur

    def comm_cost(self, a: float, b: float) -> float:
        """Communication DRAM cost bytes placed so far that land inside [a, b]."""
        return sum(f.within(a, b) for f in self.flows)

    def _gemm_busy_until(self) -> float:
        """When the GEMM is expected to finish (placed stages, then isolated times)."""
        if self.plan is None:
            return -math.inf
        rest = sum(w.time_s for w in self.plan.waves[len(self.ends):])
        return (self.ends[-1] if self.ends else self._cursor) + rest

    def _gemm_demand(self) -> float:
        """The GEMM's average DRAM demand in cost bytes per second (isolated)."""
        assert self.plan is not None
        if self._demand is None:
            num = sum(w.read_bytes + w.write_bytes * wl * wc for w, wl, wc in
                      zip(self.plan.waves, self.write_local, self.write_cost))
            self._demand = num / self.plan.time_s if self.plan.time_s > 0 else 0.0
        return self._demand

    # ---- transfers ---------------------------------------------------------------------
    def _dram_for_comm(self, during_gemm: bool) -> float:
        """DRAM bandwidth communication gets (all of it once the GEMM is done)."""
        if during_gemm and self.plan is not None:
            return comm_dram_bw(self._gemm_demand(), self.arb, self.bw)
        return self.bw

    def _rate(self, bc: ByteCost, during_gemm: bool) -> float:
        """Bytes/s one lane moves: min of link, communication's DRAM share, CU throughput."""
        per_byte = bc.cost + self.costs.incoming.cost
        by_dram = (self._dram_for_comm(during_gemm) / (per_byte * self.lanes)
                   if per_byte > 0 else math.inf)
        by_cu = self.cu_bw / (bc.cu_bytes * self.lanes) if bc.cu_bytes > 0 else math.inf
        return min(self.link_bw, by_dram, by_cu)

    def duration(self, t0: float, nbytes: float, bc: ByteCost) -> float:
        """The time to move nbytes from t0, faster once the GEMM is done (the hop latency is
        the network's, added on arrival)."""
        busy = self._gemm_busy_until()
        if nbytes <= 0:
            return 0.0
        if t0 >= busy:
            return nbytes / self._rate(bc, False)
        r1, r2 = self._rate(bc, True), self._rate(bc, False)
        first = (busy - t0) * r1
        if first >= nbytes:
            return nbytes / r1
        return (busy - t0) + (nbytes - first) / r2

    def send(self, tc: TimedComm, call: Call, dst: int, ready: float, nbytes: float,
             bc: ByteCost, *,
             step: int, label: str, stat: str, streamed_until: float = -math.inf
             ) -> np.ndarray:
        """Place a transfer to rank `dst` once its data is ready (through the network's one
        message path, `TimedComm.place`); returns its header.

        The port is busy for as long as DRAM (or the communication kernel's CUs) can feed
        it; a remote update (`streamed_until` = end of the stage that writes it) streams out
        while the GEMM stores it: it cannot end before that stage, and its DRAM footprint up
        to then is already charged to the stage (`attached`).
        """
        header = tc.place(dst, nbytes, ready, call, label=label, stage=step,
                          dram_bytes=nbytes * (bc.reads + bc.writes),
                          feed=lambda t0: max(self.duration(t0, nbytes, bc),
                                              streamed_until - t0))
        t0, t1 = float(header[0]), float(header[1])
        if self.plan is not None and t1 > max(t0, streamed_until):
            cost = nbytes * (bc.cost + self.costs.incoming.cost)
            a = max(t0, streamed_until)
            share = (t1 - a) / (t1 - t0) if t1 > t0 else 1.0
            self.flows.append(Flow(a, t1, cost * share))
        self.account(stat, nbytes, bc)
        return header

    def reduce(self, res: str, ready: float, nbytes: float, n_elems: int, isolated_s: float,
               *, step: int, label: str, stat: str) -> float:
        """A reduction kept locally (the last RS step of a CU-based ring); returns its end."""
        bc = self.costs.final
        t0 = max(ready, self.tl.free_at(res))
        busy = t0 < self._gemm_busy_until()
        slow = self.bw / self._dram_for_comm(busy)
        by_cu = nbytes * bc.cu_bytes / self.cu_bw if math.isfinite(self.cu_bw) else 0.0
        t1 = t0 + max(isolated_s * slow, by_cu)
        self.tl.place(label, [res], t0, t1, cat="comm", flops=float(n_elems),
                      dram_bytes=nbytes * (bc.reads + bc.writes), stage=step)
        if self.plan is not None:
            self.flows.append(Flow(t0, t1, nbytes * bc.cost))
        self.account(stat, nbytes, bc)
        return t1

    def account(self, stat: str, nbytes: float, bc: ByteCost) -> None:
        """Count the DRAM bytes of a ring step (`stat`: 'rs' or 'ag')."""
        if self.stats is not None:
            self.stats.add(f"{stat}_read", nbytes * bc.reads)
            self.stats.add(f"{stat}_write", nbytes * bc.writes)

"""What each strategy costs the hardware: GEMM stages, DRAM bytes per ring byte, CU limits.

No MPI here. The fused schedules (`rs.py`, `ag.py`) ask these tables how long things take; the
numbers come from the device's cost (`devices.gemm` stages) and the preset (`devices.contention`).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import NamedTuple

from ..devices.contention import NO_CONTENTION, Arbitration, T3Params, mca, round_robin
from ..devices.cost import DeviceCost
from ..devices.gemm import GemmCost
from .strategy import Overlap


class Wave(NamedTuple):
    """One GEMM stage as the fused schedules see it (launch folded into the first)."""

    time_s: float
    read_bytes: float
    write_bytes: float
    flops: float
    pos0: float           # fraction of the output's tiles done before this stage
    pos1: float


class GemmPlan(NamedTuple):
    """A GEMM's stages on this device, as fractions of its output in execution order."""

    cost: GemmCost
    waves: tuple[Wave, ...]

    @property
    def n_stages(self) -> int:
        return self.cost.n_stages

    @property
    def time_s(self) -> float:
        return sum(w.time_s for w in self.waves)

    def wave_of(self, pos: float) -> int:
        """The stage that completes the output up to fraction `pos` (its last tile's stage)."""
        ends = [w.pos1 for w in self.waves]
        return min(bisect.bisect_left(ends, pos - 1e-12), len(self.waves) - 1)

    def read_intensity(self, bw: float) -> float:
        """Share of the first stage the DRAM spends on its reads (what MCA observes, 8.3.5)."""
        w = self.waves[0]
        return (w.read_bytes / bw) / w.time_s if w.time_s > 0 else 0.0


def gemm_plan(cost: DeviceCost, m: int, n: int, k: int, dtype: str, *,
              uncached_output: bool = False, compute_units: int | None = None) -> GemmPlan:
    """Stages of C[m, n] = A[m, k] B[k, n] with the strategy's cache / CU choices."""
    kw: dict[str, object] = {}
    if uncached_output:
        kw["bypass_llc_output"] = True
    if compute_units is not None:
        kw["compute_units"] = compute_units
    g = cost.gemm(m, n, k, dtype=dtype, **kw)  # type: ignore[arg-type]
    total = sum(s.tiles for s in g.stages)
    waves, done = [], 0
    for i, s in enumerate(g.stages):
        launch = g.launch_s if i == 0 else 0.0
        waves.append(Wave(s.time_s + launch, s.dram_read_bytes, s.dram_write_bytes,
                          g.flops * s.tiles / total, done / total, (done + s.tiles) / total))
        done += s.tiles
    return GemmPlan(g, tuple(waves))


class ByteCost(NamedTuple):
    """Per byte a ring step moves: local DRAM reads, writes, their time cost, CU traffic."""

    reads: float
    writes: float
    cost: float           # DRAM time in plain-access bytes (an NMC update counts nmc_update_cost)
    cu_bytes: float       # loads + stores through the communication kernel's CUs (0: DMA)


class RingCosts(NamedTuple):
    """The DRAM and CU footprint of each kind of ring step under one strategy (Fig. 8.8)."""

    first: ByteCost       # step 0 send of a rank's own partial
    steady: ByteCost      # reduce (or forward) and send
    incoming: ByteCost    # bytes landing in this rank's memory from the previous rank
    final: ByteCost       # last reduce-scatter step, kept locally
    write_cost: float     # DRAM cost of one GEMM output byte written locally


def rs_costs(ov: Overlap, nmc_cost: float) -> RingCosts:
    """Reduce-scatter: CUs read two copies and write one; NMC reads one (thesis 8.3.3)."""
    t = ov.traits
    if t.nmc:
        first = ByteCost(0, 0, 0, 0) if t.fused else ByteCost(1, 0, 1, 0)  # remote_update
        return RingCosts(first, ByteCost(1, 0, 1, 0), ByteCost(0, 1, nmc_cost, 0),
                         ByteCost(0, 0, 0, 0), nmc_cost if t.fused else 1.0)
    return RingCosts(ByteCost(1, 0, 1, 2), ByteCost(2, 0, 2, 3), ByteCost(0, 1, 1, 0),
                     ByteCost(2, 1, 3, 3), 1.0)


def ag_costs(ov: Overlap) -> RingCosts:
    """All-gather: read the chunk to send, the received one is written (no reduction)."""
    send = ByteCost(1, 0, 1, 2.0 if ov.traits.comm_on_cus else 0.0)
    return RingCosts(send, send, ByteCost(0, 1, 1, 0), ByteCost(0, 0, 0, 0), 1.0)


def arbitration(ov: Overlap, params: T3Params | None, plan: GemmPlan, bw: float
                ) -> Arbitration:
    """The DRAM arbitration while GEMM and collective overlap (none outside fused runs)."""
    policy = ov.traits.policy
    if policy == "none" or params is None:
        return NO_CONTENTION
    if policy == "round-robin":
        return round_robin(params)
    return mca(params, plan.read_intensity(bw))


def comm_cus(ov: Overlap, total_cus: int) -> int | None:
    """CUs the communication kernel runs on while the GEMM runs (None: DMA engines)."""
    if not ov.traits.comm_on_cus or not ov.traits.fused:
        return None
    if ov.comm_cus >= total_cus:
        raise ValueError(f"overlap.comm_cus={ov.comm_cus} leaves no CU for the GEMM "
                         f"(the device has {total_cus})")
    return ov.comm_cus


@dataclass
class OverlapStats:
    """What one fused (or sequential) GEMM + collective cost this rank (for reports).

    Times and bytes accumulate: pass a fresh one per call.
    """

    strategy: str = ""
    total_s: float = 0.0
    gemm_s: float = 0.0              # compute-stream time of the GEMM (all its stages)
    gemm_isolated_s: float = 0.0     # the same GEMM alone on the device
    rs_s: float = 0.0                # reduce-scatter span (first send to last result)
    ag_s: float = 0.0                # all-gather span
    n_stages: int = 0
    mca_threshold: int = 0           # 0 when MCA is off
    dram: dict[str, float] = field(default_factory=lambda: {
        k: 0.0 for k in ("gemm_read", "gemm_write", "rs_read", "rs_write", "ag_read",
                         "ag_write")})

    def add(self, key: str, nbytes: float) -> None:
        self.dram[key] += nbytes

    @property
    def dram_total(self) -> float:
        return sum(self.dram.values())

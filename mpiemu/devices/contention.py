"""DRAM sharing between an overlapped GEMM and collective traffic (thesis 8.2.2.2, 8.3.5, 8.5.1.2).

A GEMM runs in stages (waves); each stage reads its input panels (the reads the compute units
wait on) and writes its output tiles (posted stores). When collective traffic (DMA reads,
incoming updates, reduction kernels) hits the same DRAM during a stage, two things happen:

* the DRAM must serve both: a stage cannot end before its own bytes are served at the share
  of the bandwidth the arbitration leaves it;
* collective requests that sit in the memory-controller queue ahead of the GEMM's critical
  accesses delay them. Critical are the reads the compute units wait on and, when the
  output bypasses the LLC (T3's uncached, near-memory-updated output, 8.3.3), the stores a
  workgroup must hand to DRAM before it retires; a write-back LLC absorbs them otherwise.
  A critical access waits for the communication accesses served before it (`exposure` per
  critical access), so the stall is exposure * min(comm bytes, critical bytes) / bandwidth.

A cache-resident GEMM (few DRAM reads) therefore barely slows, a GEMM that streams its
inputs from DRAM slows with the communication it overlaps (thesis 8.5.1.2, Fig. 8.15).
Nothing here knows of MPI: callers pass bytes and times.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

POLICIES = ("none", "round-robin", "compute-first")

@dataclass(frozen=True)
class T3Params:
    """Memory-system and communication-kernel parameters of the overlap models (preset [t3])."""

    nmc_update_cost: float              # DRAM time of an op-and-store byte / a plain write byte
    dram_queue_entries: int             # memory-controller scheduling queue depth
    mca_threshold_high: int             # queue entries comm may hold: high/mid/low intensity
    mca_threshold_mid: int
    mca_threshold_low: int
    mca_intensity_high: float           # first-stage read occupancy that selects each threshold
    mca_intensity_mid: float
    mca_intensity_low: float
    mca_starvation_limit_cycles: float  # comm gets one burst after this many cycles without
    dram_burst_cycles: float            # DRAM cycles one access burst occupies a channel
    comm_cu_bw_bytes_per_s: float       # loads + stores one CU of a communication kernel sustains
    round_robin_exposure: float         # comm accesses served ahead of a critical one (8.3.5)

    def __post_init__(self) -> None:
        if self.nmc_update_cost < 1:
            raise ValueError(f"nmc_update_cost={self.nmc_update_cost} must be >= 1")
        if self.dram_queue_entries < 1:
            raise ValueError(f"dram_queue_entries={self.dram_queue_entries} must be >= 1")
        if any(not 0 < t <= self.dram_queue_entries for t in self.mca_thresholds):
            raise ValueError(f"mca thresholds {self.mca_thresholds} must lie in "
                             f"(0, {self.dram_queue_entries}]")
        hi, mid, lo = self.mca_intensity_cutoffs
        if not hi >= mid >= lo >= 0:
            raise ValueError(f"mca intensity cutoffs {self.mca_intensity_cutoffs} must be "
                             "decreasing and >= 0")
        if self.mca_starvation_limit_cycles < self.dram_burst_cycles:
            raise ValueError("mca_starvation_limit must be >= dram_burst")
        if self.comm_cu_bw_bytes_per_s <= 0:
            raise ValueError(f"comm_cu_bw={self.comm_cu_bw_bytes_per_s} must be > 0")
        if not 0 <= self.round_robin_exposure <= 2:
            raise ValueError(f"round_robin_exposure={self.round_robin_exposure} must lie in "
                             "[0, 2]")

    @property
    def mca_thresholds(self) -> tuple[int, int, int]:
        return self.mca_threshold_high, self.mca_threshold_mid, self.mca_threshold_low

    @property
    def mca_intensity_cutoffs(self) -> tuple[float, float, float]:
        return self.mca_intensity_high, self.mca_intensity_mid, self.mca_intensity_low

    def mca_threshold(self, read_intensity: float) -> int:
        """Queue entries communication may occupy, smaller for memory-intensive GEMMs (8.3.5).

        `read_intensity` is the fraction of the GEMM's first (isolated) stage that the DRAM
        spends on its reads: what the memory controller observes before the overlap starts.
        Below the lowest cutoff there is no limit (the whole queue).
        """
        for cutoff, entries in zip(self.mca_intensity_cutoffs, self.mca_thresholds):
            if read_intensity >= cutoff:
                return entries
        return self.dram_queue_entries


@dataclass(frozen=True)
class Arbitration:
    """How the memory controller orders GEMM and communication accesses."""

    policy: str
    exposure: float          # communication accesses served ahead of each critical GEMM access
    min_comm_share: float    # DRAM share communication keeps even when the GEMM has priority

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy={self.policy!r}; choose one of {list(POLICIES)}")
        if not 0 <= self.exposure <= 2 or not 0 <= self.min_comm_share <= 1:
            raise ValueError(f"exposure={self.exposure} must lie in [0, 2] and "
                             f"min_comm_share={self.min_comm_share} in [0, 1]")


NO_CONTENTION = Arbitration("none", 0.0, 1.0)


def round_robin(params: T3Params) -> Arbitration:
    """Baseline controller: alternate between the streams, fall back when one is empty.

    Communication bursts fill the scheduling queue (thesis 8.3.5), so a critical GEMM access
    first waits for an entry that a communication access frees, then for the communication
    access the alternation serves before it: `round_robin_exposure` (2, the preset's) per
    critical access. Under saturation each stream gets half of the DRAM.
    """
    return Arbitration("round-robin", params.round_robin_exposure, 0.5)


def mca(params: T3Params, read_intensity: float) -> Arbitration:
    """T3-MCA: compute first, comm only below a queue-occupancy threshold, never starved.

    Compute accesses are picked first, so none waits for scheduling; one waits for admission
    only in the share `threshold / entries` of the queue communication may hold. Under
    saturation communication keeps the starvation-limit share (one burst per limit).
    """
    threshold = params.mca_threshold(read_intensity)
    starve = params.dram_burst_cycles / params.mca_starvation_limit_cycles
    return Arbitration("compute-first", threshold / params.dram_queue_entries, starve)


class StageDemand(NamedTuple):
    """One GEMM stage in isolation: its time, its DRAM bytes, the accesses it waits on."""

    time_s: float
    read_bytes: float
    write_cost_bytes: float       # write bytes x their DRAM cost (NMC updates cost more)
    critical_bytes: float         # reads, plus the writes when they bypass the LLC


def stage_s(d: StageDemand, comm_cost_bytes: float, arb: Arbitration, bw: float) -> float:
    """A stage's duration when `comm_cost_bytes` of communication share its DRAM.

    max(isolated time + read stall, time for the DRAM to serve the stage's own bytes at the
    share the policy leaves it). Round-robin gives comm up to half of a saturated DRAM;
    compute-first only the guaranteed starvation share.
    """
    if arb.policy == "none" or comm_cost_bytes <= 0:
        return d.time_s
    own = d.read_bytes + d.write_cost_bytes
    stall = arb.exposure * min(comm_cost_bytes, d.critical_bytes) / bw
    ceding = arb.min_comm_share / (1.0 - arb.min_comm_share) if arb.min_comm_share < 1 else 0.0
    served_comm = min(comm_cost_bytes, ceding * own)
    return max(d.time_s + stall, (own + served_comm) / bw)


def solve_stage(d: StageDemand, comm_cost_over: Callable[[float], float], arb: Arbitration,
                bw: float, iterations: int = 60) -> tuple[float, float]:
    """Least fixed point of duration = stage_s(comm bytes overlapping that duration).

    `comm_cost_over(duration)` returns the communication DRAM cost that overlaps a stage of
    that length starting at its (caller-known) start. Iterating from the isolated time rises
    monotonically toward the least fixed point; if it has not settled after `iterations`
    steps, bisection between the last iterate and the bound finishes. Deterministic.
    Returns (duration, comm cost bytes).
    """
    def g(dur: float) -> float:
        return stage_s(d, comm_cost_over(dur), arb, bw)

    dur = d.time_s
    for _ in range(iterations):
        new = g(dur)
        if new <= dur * (1 + 1e-12):
            return dur, comm_cost_over(dur)
        dur = new
    own = d.read_bytes + d.write_cost_bytes
    lo, hi = dur, max(d.time_s + arb.exposure * d.critical_bytes / bw, 2.0 * own / bw, dur)
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if g(mid) > mid else (lo, mid)
    return hi, comm_cost_over(hi)


def comm_dram_bw(gemm_demand_bytes_per_s: float, arb: Arbitration, bw: float) -> float:
    """DRAM bandwidth communication gets while a GEMM demands `gemm_demand` of it."""
    if arb.policy == "none":
        return bw
    free = max(0.0, bw - gemm_demand_bytes_per_s)
    return max(free, arb.min_comm_share * bw)

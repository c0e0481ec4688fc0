"""Overlap strategies and their switch (no MPI here, so configs can import it cheaply).

Each strategy is a set of traits (thesis 8.2.2 and 8.4.3):

| strategy    | GEMM and collective              | reductions      | DRAM arbitration      |
|-------------|----------------------------------|-----------------|-----------------------|
| sequential  | GEMM, then RS, then AG (*)       | CUs             | -                     |
| ideal       | max(GEMM, RS), no deps, then AG  | CUs             | none (no contention)  |
| ideal+nmc   | as ideal                         | near memory     | none                  |
| sw-overlap  | fused, comm kernel on some CUs   | CUs             | round-robin           |
| t3          | fused, track & trigger (DMA)     | near memory     | round-robin           |
| t3-mca      | fused, track & trigger (DMA)     | near memory     | compute-first + MCA   |

(*) An all-reduce that NCCL's tuner runs other than as a ring (NVLS on an NVSwitch node, a
tree or the hierarchical form across nodes) runs as `comm.collectives.all_reduce` does, after
the GEMM (`overlap.api`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

STRATEGIES = ("sequential", "ideal", "ideal+nmc", "sw-overlap", "t3", "t3-mca")
MODES = ("all_reduce", "reduce_scatter")


class Traits(NamedTuple):
    """What a strategy changes in the schedule and in the hardware model."""

    fused: bool              # per-chunk data dependencies between GEMM and collective
    concurrent: bool         # GEMM and collective may run at the same time
    nmc: bool                # reductions as near-memory op-and-store (thesis 8.3.3)
    uncached_output: bool    # GEMM output bypasses the LLC (T3's uncached flag, 8.3.3)
    policy: str              # DRAM arbitration while they overlap (devices.contention.POLICIES)
    comm_on_cus: bool        # the collective runs as a kernel on compute units


TRAITS: dict[str, Traits] = {
    "sequential": Traits(False, False, False, False, "none", True),
    "ideal": Traits(False, True, False, False, "none", True),
    "ideal+nmc": Traits(False, True, True, False, "none", False),
    "sw-overlap": Traits(True, True, False, False, "round-robin", True),
    "t3": Traits(True, True, True, True, "round-robin", False),
    "t3-mca": Traits(True, True, True, True, "compute-first", False),
}


@dataclass(frozen=True)
class Overlap:
    """How a GEMM and its TP collective are scheduled (thesis 8.4.3 configurations)."""

    strategy: str = "sequential"
    bidirectional: bool = False          # ring collectives use both link directions
    comm_cus: int = 16                   # sw-overlap: CUs given to the communication kernel
    pieces: int = 0                      # sub-chunks per chunk; 0: one per GEMM stage spanned

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"overlap.strategy={self.strategy!r}; choose one of "
                             f"{list(STRATEGIES)}")
        if self.comm_cus < 1:
            raise ValueError(f"overlap.comm_cus={self.comm_cus} must be >= 1")
        if self.pieces < 0:
            raise ValueError(f"overlap.pieces={self.pieces} must be >= 0 (0: per GEMM stage)")

    @property
    def traits(self) -> Traits:
        return TRAITS[self.strategy]

    @property
    def label(self) -> str:
        """Name for tables: sw-overlap carries its CU split (thesis Fig. 8.4: 64-16)."""
        if self.strategy == "sw-overlap":
            return f"sw-overlap({self.comm_cus})"
        return self.strategy

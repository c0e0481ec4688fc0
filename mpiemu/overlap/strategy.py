"""Overlap strategies and their switch (no MPI here, so configs can import it cheaply)."""
from __future__ import annotations

from dataclasses import dataclass

STRATEGIES = ("sequential", "ideal", "ideal+nmc", "sw-overlap", "t3", "t3-mca")
MODES = ("all_reduce", "reduce_scatter")


@dataclass(frozen=True)
class Overlap:
    """How a GEMM and its TP collective are scheduled (thesis 8.4.3 configurations)."""

    strategy: str = "sequential"
    bidirectional: bool = False          # ring collectives use both link directions

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"overlap.strategy={self.strategy!r}; choose one of "
                             f"{list(STRATEGIES)}")

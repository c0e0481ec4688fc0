"""Workload sections of GEMM / collective overlap: [overlap] and the [sublayers] sweep."""
from __future__ import annotations

from dataclasses import dataclass

from ...overlap.strategy import STRATEGIES, Overlap
from ..errors import ConfigError


@dataclass(frozen=True)
class OverlapSection:
    """How every TP GEMM + collective pair is scheduled (thesis 8.4.3 configurations)."""

    strategy: str = "sequential"
    bidirectional: bool = False

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ConfigError("overlap.strategy", self.strategy, STRATEGIES)

    def to_overlap(self) -> Overlap:
        return Overlap(strategy=self.strategy, bidirectional=self.bidirectional)


@dataclass(frozen=True)
class SublayersSection:
    """A sweep of TP sub-layers (OP-fwd, FC-2-fwd, FC-1-bwd, IP-bwd) over strategies."""

    models: tuple[str, ...] = ("mega-gpt2",)

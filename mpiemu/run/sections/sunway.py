"""Workload section of Sunway ranks: [sunway]."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SunwaySection:
    """Execution mode, attention kernel and inter-op scheduler of SW26010pro ranks."""

    mode: str = "all-shared"

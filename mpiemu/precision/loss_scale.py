"""FP16 dynamic loss scaling as Megatron-Core does it (`core/optimizer/grad_scaler.py:
DynamicGradScaler`; defaults from `core/optimizer/__init__.py` and `arguments.py`;
modern_training.md §7.5).

The loss is multiplied by the scale before the backward pass so that small fp16 gradients do
not flush to zero; the fp32 main gradients are divided by it before the step. A gradient
that overflowed (inf or NaN on any rank) skips the optimizer step; `hysteresis` overflows in
a row lower the scale by `backoff_factor` (not below `min_scale`); `growth_interval` steps
without overflow raise it by `growth_factor`.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import ContextManager

import numpy as np


def overflow_expected(scaled: bool) -> ContextManager[object]:
    """numpy quiet about overflow while a scaled backward runs: the overflow is what the
    scaler looks for, not an error."""
    return np.errstate(over="ignore", invalid="ignore") if scaled else contextlib.nullcontext()


@dataclass
class DynamicLossScaler:
    """The scale and its two trackers (Megatron's `_growth_tracker`, `_hysteresis_tracker`)."""

    scale: float = 2.0 ** 32
    min_scale: float = 1.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 1000
    hysteresis: int = 2
    growth_tracker: int = field(default=0, init=False)
    hysteresis_tracker: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.hysteresis_tracker = self.hysteresis

    def update(self, found_inf: bool) -> bool:
        """After a backward pass: adjust the scale; True if the step may run (no overflow)."""
        if found_inf:
            self.growth_tracker = 0
            self.hysteresis_tracker -= 1
            if self.hysteresis_tracker <= 0:
                self.scale = max(self.scale * self.backoff_factor, self.min_scale)
            return False
        self.growth_tracker += 1
        if self.growth_tracker == self.growth_interval:
            self.growth_tracker = 0
            self.hysteresis_tracker = self.hysteresis
            self.scale *= self.growth_factor
        return True

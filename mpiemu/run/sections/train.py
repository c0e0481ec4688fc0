"""Workload sections of the transformer training kind: [model], [train], [optimizer]."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelSection:
    """Which transformer: a preset name (mpiemu/nn/presets) plus optional overrides."""

    preset: str = "tiny"


@dataclass(frozen=True)
class TrainSection:
    """Batching and training-loop options."""

    global_batch: int = 8


@dataclass(frozen=True)
class OptimizerSection:
    """Adam or LAMB and their hyper-parameters."""

    name: str = "adam"

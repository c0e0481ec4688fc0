"""Workload section of the layer sweep kind: [layer_sweep] (thesis ch. 5, Table 5.1)."""
from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError


@dataclass(frozen=True)
class LayerSweepSection:
    """Every (hidden, seq_len, batch, compute_scale) point runs one transformer layer,
    forward and backward, timing only: H from `hidden`, heads of `head_dim`, FC width
    `ffn_factor` x H (thesis 2.2.2.3); then over DP, each measured apart, its gradients in one
    bucket and the FC weight's gradient alone (the thesis's region of interest, Eq. 5.8)."""

    hidden: tuple[int, ...] = (1024,)
    seq_len: tuple[int, ...] = (1024,)
    batch: tuple[int, ...] = (1,)            # sequences per DP rank
    compute_scale: tuple[float, ...] = (1.0,)   # device.scale.compute of each point
    head_dim: int = 128
    ffn_factor: int = 4

    def __post_init__(self) -> None:
        for name in ("hidden", "seq_len", "batch"):
            for i, v in enumerate(getattr(self, name)):
                if v < 1:
                    raise ConfigError(f"layer_sweep.{name}[{i}]", v, "an integer >= 1")
        for i, s in enumerate(self.compute_scale):
            if not s > 0:
                raise ConfigError(f"layer_sweep.compute_scale[{i}]", s, "a factor > 0")
        if self.head_dim < 1 or self.ffn_factor < 1:
            raise ConfigError("layer_sweep.head_dim", self.head_dim, "an integer >= 1")

    def check_tp(self, tp: int) -> None:
        """Heads and FC width must split evenly over the TP ranks (Megatron)."""
        for i, h in enumerate(self.hidden):
            if h % self.head_dim or (h // self.head_dim) % tp:
                raise ConfigError(f"layer_sweep.hidden[{i}]", h, f"needs a multiple of "
                                  f"head_dim={self.head_dim} whose head count divides by "
                                  f"parallel.tp={tp}")

"""A rank's dropout keep-masks for one iteration, sliced from the full seeded tensors.

The full mask of a site covers the whole global batch (`seeded`); this rank takes its
micro-batch (samples), its heads (attention probabilities) and, under sequence parallelism,
its sequence rows. Masks exist only when numerics are on and the rate is above zero.
"""
from __future__ import annotations

import numpy as np

from . import seeded
from .config import ModelConfig
from .dims import Dims


class Masks:
    """Keep-masks of one rank for one iteration (bool; scaled by 1/(1-p) where applied)."""

    def __init__(self, cfg: ModelConfig, seed: int, iteration: int, dims: Dims,
                 sample0: int, tp_rank: int, numerics: bool,
                 positions: np.ndarray | None = None) -> None:
        self.cfg, self.seed, self.it, self.d = cfg, seed, iteration, dims
        self.samples = range(sample0, sample0 + dims.batch)      # this micro-batch's
        self.heads = range(tp_rank * dims.heads, (tp_rank + 1) * dims.heads)
        s_loc = dims.seq // dims.tp if dims.sp else dims.seq
        s0 = tp_rank * s_loc if dims.sp else 0
        seq = np.arange(dims.seq) if positions is None else positions   # the rank's (CP)
        self.rows = seq[s0:s0 + s_loc]              # sequence positions of its shard's rows
        self.on = numerics

    def hidden(self, layer: int, site: str) -> np.ndarray | None:
        """[shard rows, H] keep-mask of a hidden-state site (rows: position-major)."""
        p = self.cfg.hidden_dropout
        if not self.on or p == 0.0:
            return None
        shape = (self.cfg.seq_len, self.cfg.hidden)
        per_sample = [seeded.hidden_keep(self.seed, self.it, layer, site, b, shape, p)
                      [self.rows] for b in self.samples]
        return np.stack(per_sample, axis=1).reshape(-1, self.cfg.hidden)   # (S_loc*B, H)

    def probs(self, layer: int) -> np.ndarray | None:
        """(B, local heads, S, S) keep-mask of the attention probabilities."""
        p = self.cfg.attention_dropout
        if not self.on or p == 0.0:
            return None
        return np.stack([np.stack([seeded.probs_keep(self.seed, self.it, layer, b, h,
                                                     self.cfg.seq_len, p)
                                   for h in self.heads]) for b in self.samples])

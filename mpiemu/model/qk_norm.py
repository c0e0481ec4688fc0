"""QK-norm (Qwen3): an RMSNorm over each query and each key head's head_dim values, with one
gain of head_dim for q and one for k, shared by every head, on one TP rank's heads.

Where it runs: after the QKV GEMM (and, when TP exceeds the KV heads, after the rank took
its group out of the gathered output) and before the rotary embedding, as Megatron-Core's
`SelfAttention.get_query_key_value_tensors` applies `q_layernorm` / `k_layernorm` to the
[sq, b, heads, head_dim] query and key (`qk_layernorm=True`: TENorm of hidden size
kv_channels, megatron/core/models/gpt/gpt_layer_specs.py) and rotates them afterwards in
`SelfAttention.forward`; HF transformers `Qwen3Attention.forward` does the same
(`q_norm(q_proj(x).view(..., head_dim))`, then `apply_rotary_pos_emb`). The Qwen3 report
(arXiv 2505.09388, 2) introduces it in place of Qwen2's QKV bias.

Each rank holds its own heads, so a gain's gradient here sums over those heads only: the
training step all-reduces it over TP (`LocalParam.heads_shared`, `training/gradients.py`).
Each norm is charged as Transformer Engine's RMSNorm kernel over rows x heads rows of
head_dim (`devices/kernels.py` `rmsnorm`), as the layer's own norms.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .block import Cache, Params, acc
from .config import ModelConfig
from .dims import Dims
from .executor import Array, Executor, Ready
from .ops import norm_cost, rmsnorm, rmsnorm_back


class QkNorm:
    """The q and k norms of layer `prefix` on one rank's [rows, q | k | v] (in place)."""

    def __init__(self, ex: Executor, cfg: ModelConfig, dims: Dims, prefix: str,
                 tag: str) -> None:
        self.E, self.cfg, self.d, self.p, self.tag = ex, cfg, dims, prefix, tag

    def _parts(self) -> tuple[tuple[str, int, int, int], ...]:
        """(which, first column, columns, heads) of q and of k in the rank's QKV output."""
        d = self.d
        qw, kw = d.heads * d.head_dim, d.kv_heads * d.head_dim
        return (("q", 0, qw, d.heads), ("k", qw, kw, d.kv_heads))

    def forward(self, qkv: Array, P: Params) -> Cache:
        """Normalize q and k of `qkv` in place; what backward needs, per norm."""
        d, E = self.d, self.E
        c: Cache = {}
        for what, lo, width, heads in self._parts():
            cost = norm_cost("rmsnorm", d.rows * heads, d.head_dim, E.e)
            c[what] = E.kernel(f"{self.tag}.{what}_norm.fwd", cost, self._norm, qkv, lo, width,
                               P[self.p + f"{what}_norm.g"])
        return c

    def backward(self, dqkv: Array, c: Cache, P: Params, G: Params, ready: Ready) -> None:
        """The input gradient of q and k in place of theirs in `dqkv`; the gains' gradients
        (this rank's heads' share) accumulated and handed over."""
        d, E = self.d, self.E
        names = []
        for what, lo, width, heads in self._parts():
            cost = norm_cost("rmsnorm", d.rows * heads, d.head_dim, E.e, backward=True)
            name = self.p + f"{what}_norm.g"
            acc(G, name, E.kernel(f"{self.tag}.{what}_norm.bwd", cost, self._back, dqkv, lo,
                                  width, c[what], P[name]))
            names.append(name)
        ready(names)

    def _norm(self, qkv: np.ndarray, lo: int, width: int, g: np.ndarray) -> dict[str, Any]:
        """RMSNorm of each head of columns [lo, lo + width); keeps the input and rstd."""
        x = qkv[:, lo:lo + width].copy().reshape(-1, self.d.head_dim)   # (rows x heads, dh)
        y, keep = rmsnorm(x, g, self.cfg.layernorm_eps)
        qkv[:, lo:lo + width] = y.reshape(qkv.shape[0], width)
        return keep

    def _back(self, dqkv: np.ndarray, lo: int, width: int, keep: dict[str, Any],
              g: np.ndarray) -> np.ndarray:
        """dx in place of dy in columns [lo, lo + width); the gain's gradient returned."""
        dy = dqkv[:, lo:lo + width].reshape(-1, self.d.head_dim)
        dx, dg = rmsnorm_back(dy, keep, g)
        dqkv[:, lo:lo + width] = dx.reshape(dqkv.shape[0], width)
        return dg

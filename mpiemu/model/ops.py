"""Primitive ops of the sharded transformer: numpy forward/backward, and what each costs.

Every op has its math (on numpy arrays of the numeric dtype) beside a `*_cost` function that
states the kernels it launches (flops and DRAM bytes in the emulated dtype, `e` bytes per
element) for the timing model; `mode` is `train.kernels` ("unfused": one kernel per op as
plain PyTorch; "fused": Megatron-LM's fused kernels, `devices.kernels`). 2-D activations are
[rows, width] (rows = sequence x batch, sequence first).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..devices import kernels as hk
from ..devices.kernels import GELU_FLOPS, MASK_BYTES, STAT_BYTES
from ..devices.kernels import Kernel as Cost
from .special import norm_cdf, norm_pdf

__all__ = ["Cost", "GELU_FLOPS", "MASK_BYTES", "STAT_BYTES"]


# -- LayerNorm (replicated, or on the sequence shard under SP) ------------------------------
def layernorm(x: np.ndarray, g: np.ndarray, b: np.ndarray, eps: float
              ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """y = (x - mean) / sqrt(var + eps) * g + b over the last axis; keeps x, mean, rstd."""
    mean = x.mean(-1)
    xc = x - mean[:, None]
    rstd = 1.0 / np.sqrt((xc * xc).mean(-1) + eps)
    xc *= rstd[:, None]
    return xc * g + b, {"x": x, "mean": mean, "rstd": rstd}


def layernorm_back(dy: np.ndarray, c: dict[str, np.ndarray], g: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dx, dg, db) of `layernorm`."""
    rstd = c["rstd"][:, None]
    xhat = (c["x"] - c["mean"][:, None]) * rstd
    dg, db = (dy * xhat).sum(0), dy.sum(0)
    dxhat = dy * g
    dx = rstd * (dxhat - dxhat.mean(-1, keepdims=True)
                 - xhat * (dxhat * xhat).mean(-1, keepdims=True))
    return dx, dg, db


def layernorm_cost(rows: int, width: int, e: int, backward: bool = False) -> list[Cost]:
    return hk.layernorm(rows, width, e, backward)


# -- bias + GeLU (Megatron's fused bias_gelu), thesis Eq. 4.1 --------------------------------
def bias_gelu(f: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(x, gelu(x)) with x = f + b and gelu(x) = x Phi(x)."""
    x = f + b
    return x, x * norm_cdf(x)


def bias_gelu_back(dy: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(dx, db): gelu'(x) = Phi(x) + x phi(x)."""
    dx = dy * (norm_cdf(x) + x * norm_pdf(x))
    return dx, dx.sum(0)


def bias_gelu_cost(rows: int, width: int, e: int, backward: bool = False,
                   mode: str = "fused") -> list[Cost]:
    return hk.bias_gelu(rows, width, e, mode, backward)


# -- bias + dropout + residual add (Megatron's fused bias_dropout_add) ------------------------
def bias_dropout_add(x: np.ndarray, a: np.ndarray, b: np.ndarray, keep: np.ndarray | None,
                     p: float) -> np.ndarray:
    """x + DR(a + b): keep-mask scaled by 1 / (1 - p)."""
    y = a + b
    if keep is not None:
        y *= keep
        y *= 1.0 / (1.0 - p)
    y += x
    return y


def dropout(x: np.ndarray, keep: np.ndarray | None, p: float) -> np.ndarray:
    """x * keep / (1 - p): dropout, and equally its backward (the same mask multiply)."""
    if keep is None:
        return x
    return x * keep * (1.0 / (1.0 - p))


def dropout_add_cost(rows: int, width: int, e: int, dropout: bool,
                     backward: bool = False, mode: str = "fused") -> list[Cost]:
    return hk.bias_dropout_add(rows, width, e, dropout, mode, backward)


# -- vocab-parallel embedding (Megatron VocabParallelEmbedding) -------------------------------
def embed_lookup(table: np.ndarray, ids: np.ndarray, lo: int) -> np.ndarray:
    """Rows of this rank's vocab slice [lo, lo + rows); zeros for tokens another rank owns."""
    local = ids - lo
    valid = (local >= 0) & (local < table.shape[0])
    out = table[np.where(valid, local, 0)]
    out[~valid] = 0.0
    return out


def embed_scatter(dtable: np.ndarray, ids: np.ndarray, lo: int, dy: np.ndarray) -> None:
    """dtable[ids - lo] += dy for the tokens this rank owns."""
    local = ids - lo
    valid = (local >= 0) & (local < dtable.shape[0])
    np.add.at(dtable, local[valid], dy[valid])


def embed_cost(rows: int, width: int, e: int, backward: bool = False) -> Cost:
    act = rows * width * e
    return Cost(rows * width if backward else 0.0, act + rows * 8, act)


# -- vocab-parallel cross-entropy (Megatron _VocabParallelCrossEntropy) ------------------------
def ce_local_stats(logits: np.ndarray, targets: np.ndarray, lo: int) -> np.ndarray:
    """[rows, 2]: log-sum-exp of this vocab slice, and the target's logit if it lies here."""
    mx = logits.max(-1)
    lse = mx + np.log(np.exp(logits - mx[:, None]).sum(-1))
    local = targets - lo
    valid = (local >= 0) & (local < logits.shape[1])
    picked = np.where(valid, logits[np.arange(len(targets)), np.where(valid, local, 0)], 0.0)
    return np.stack([lse, picked], axis=1)


def ce_combine(stats: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(lse, target logit) per row from every rank's [tp, rows, 2] statistics."""
    lse_r = stats[:, :, 0]
    mx = lse_r.max(0)
    return mx + np.log(np.exp(lse_r - mx).sum(0)), stats[:, :, 1].sum(0)


def ce_back(logits: np.ndarray, lse: np.ndarray, targets: np.ndarray, lo: int,
            scale: float) -> np.ndarray:
    """d loss / d logits of this slice: (softmax - onehot) * scale."""
    d = np.exp(logits - lse[:, None])
    local = targets - lo
    valid = np.flatnonzero((local >= 0) & (local < logits.shape[1]))
    d[valid, local[valid]] -= 1.0
    d *= scale
    return d


def ce_cost(rows: int, vocab_local: int, e: int, mode: str, backward: bool = False
            ) -> list[Cost]:
    return hk.cross_entropy(rows, vocab_local, e, mode, backward)


def bias_add_cost(rows: int, width: int, e: int) -> Cost:
    """A bias broadcast over rows, added in a kernel of its own (read the GEMM's output and
    the bias, write the sum)."""
    return Cost(rows * width, rows * width * e + width * e, rows * width * e)


def bias_grad_cost(rows: int, width: int, e: int) -> Cost:
    """Column sums of a gradient (a bias gradient not fused into another kernel)."""
    return Cost(rows * width, rows * width * e, width * e)


def stored_elements(cache: dict[str, Any]) -> tuple[int, int, int]:
    """(activation elements, fp32 statistic elements, mask elements) a cache holds."""
    act = stats = masks = 0
    for key, v in cache.items():
        if isinstance(v, dict):
            a, s, m = stored_elements(v)
            act, stats, masks = act + a, stats + s, masks + m
        elif isinstance(v, np.ndarray):
            if v.dtype == bool:
                masks += v.size
            elif key in ("mean", "rstd", "lse"):
                stats += v.size
            elif np.issubdtype(v.dtype, np.floating):
                act += v.size
    return act, stats, masks

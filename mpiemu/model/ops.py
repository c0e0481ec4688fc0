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


# -- RMSNorm (Llama; Zhang & Sennrich 2019) ---------------------------------------------------
def rmsnorm(x: np.ndarray, g: np.ndarray, eps: float) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """y = x / sqrt(mean(x^2) + eps) * g over the last axis; keeps x and rstd."""
    rstd = 1.0 / np.sqrt((x * x).mean(-1) + eps)
    return x * rstd[:, None] * g, {"x": x, "rstd": rstd}


def rmsnorm_back(dy: np.ndarray, c: dict[str, np.ndarray], g: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(dx, dg) of `rmsnorm`."""
    rstd = c["rstd"][:, None]
    xhat = c["x"] * rstd
    dg = (dy * xhat).sum(0)
    dxhat = dy * g
    return rstd * (dxhat - xhat * (dxhat * xhat).mean(-1, keepdims=True)), dg


def norm_cost(kind: str, rows: int, width: int, e: int, backward: bool = False) -> list[Cost]:
    """The kernels of a LayerNorm or an RMSNorm (`model.norm_kind`)."""
    if kind == "rmsnorm":
        return hk.rmsnorm(rows, width, e, backward)
    return hk.layernorm(rows, width, e, backward)


# -- SwiGLU (Shazeer 2020; Llama): silu(gate) * up over FC-1's [gate | up] --------------------
def silu(z: np.ndarray) -> np.ndarray:
    return z / (1.0 + np.exp(-z))


def swiglu(f: np.ndarray, b: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(pre-activation [rows, 2w], silu(gate) * up [rows, w]); the bias added first if any."""
    x = f if b is None else f + b
    gate, up = np.split(x, 2, axis=-1)
    return x, silu(gate) * up


def swiglu_back(dy: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(d pre-activation [rows, 2w], its column sums: the bias gradient) of `swiglu`:
    silu'(z) = s(z) (1 + z (1 - s(z))), s the sigmoid."""
    gate, up = np.split(x, 2, axis=-1)
    sig = 1.0 / (1.0 + np.exp(-gate))
    dx = np.concatenate([dy * up * sig * (1.0 + gate * (1.0 - sig)), dy * gate * sig], axis=-1)
    return dx, dx.sum(0)


def swiglu_cost(rows: int, width: int, e: int, mode: str, bias: bool, backward: bool = False
                ) -> list[Cost]:
    return hk.swiglu(rows, width, e, mode, bias, backward)


# -- rotary position embedding (Su et al. 2021), rotate-half pairs (Megatron's default) ------
def rope_frequencies(head_dim: int, theta: float, scaling: float = 0.0, low: float = 1.0,
                     high: float = 4.0, original_max: int = 8192) -> np.ndarray:
    """theta^(-2i/d) for i < d/2 (float64), with Llama 3.1's scaling when `scaling` > 0:
    wavelengths under original_max / high kept, over original_max / low divided by the
    factor, blended in between (Meta llama-models `apply_scaling`; Megatron-Core
    `_apply_scaling`)."""
    f = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if not scaling:
        return f
    wavelen = 2 * np.pi / f
    s = (original_max / wavelen - low) / (high - low)
    blended = (1 - s) * f / scaling + s * f
    return np.where(wavelen < original_max / high, f,
                    np.where(wavelen > original_max / low, f / scaling, blended))


def rope_tables(freqs: np.ndarray, positions: np.ndarray, dtype: type
                ) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [positions, d] of each position's angles, halves repeated (float64 math,
    then the numeric dtype)."""
    ang = positions.astype(np.float64)[:, None] * freqs[None, :]       # (S, d/2)
    ang = np.concatenate([ang, ang], axis=-1)                          # (S, d)
    return np.cos(ang).astype(dtype), np.sin(ang).astype(dtype)


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x cos + rotate_half(x) sin on (B, heads, S, d); rotate_half(x) = [-x2, x1]."""
    x1, x2 = np.split(x, 2, axis=-1)
    return x * cos + np.concatenate([-x2, x1], axis=-1) * sin


def rope_back(dy: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """dx of `rope`: dy cos + rotate_half^T(dy sin), rotate_half^T(z) = [z2, -z1]."""
    z1, z2 = np.split(dy * sin, 2, axis=-1)
    return dy * cos + np.concatenate([z2, -z1], axis=-1)


def rope_cost(rows: int, width: int, seq: int, head_dim: int, e: int, mode: str) -> list[Cost]:
    return hk.rope(rows, width, seq, head_dim, e, mode)


# -- bias + GeLU (Megatron's fused bias_gelu), thesis Eq. 4.1 --------------------------------
def bias_gelu(f: np.ndarray, b: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(x, gelu(x)) with x = f + b (f without a bias) and gelu(x) = x Phi(x)."""
    x = f + b if b is not None else f
    return x, x * norm_cdf(x)


def bias_gelu_back(dy: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(dx, db): gelu'(x) = Phi(x) + x phi(x)."""
    dx = dy * (norm_cdf(x) + x * norm_pdf(x))
    return dx, dx.sum(0)


def bias_gelu_cost(rows: int, width: int, e: int, backward: bool = False,
                   mode: str = "fused", bias: bool = True) -> list[Cost]:
    return hk.bias_gelu(rows, width, e, mode, backward, bias)


# -- bias + dropout + residual add (Megatron's fused bias_dropout_add) ------------------------
def bias_dropout_add(x: np.ndarray, a: np.ndarray, b: np.ndarray | None,
                     keep: np.ndarray | None, p: float) -> np.ndarray:
    """x + DR(a + b) (b: None without a bias): keep-mask scaled by 1 / (1 - p)."""
    y = a + b if b is not None else a.copy()
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
                     backward: bool = False, mode: str = "fused", bias: bool = True
                     ) -> list[Cost]:
    return hk.bias_dropout_add(rows, width, e, dropout, mode, backward, bias)


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

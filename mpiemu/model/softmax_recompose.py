"""Softmax recomposed (seed 004 2.3-2.4): local softmax (LS), inter-sub-vector reduction (IR),
global scaling (GS), and their fusion into the two attention GEMMs.

A row x of length L is cut into sub-vectors of T elements (the last one shorter when T does
not divide L). LS keeps, per sub-vector k, m'_k = max x_k, d'_k = sum exp(x_k - m'_k) and
X'_k = exp(x_k - m'_k); IR forms m = max_k m'_k, d = sum_k exp(m'_k - m) d'_k and the factors
r'_k = exp(m'_k - m) / d; GS writes y_k = X'_k r'_k, which is softmax(x) (seed Eq. 2).
Sub-vectors that are fully masked (-inf) contribute nothing. Arrays are (..., rows, L).
"""
from __future__ import annotations

import numpy as np


def _bounds(length: int, t: int) -> list[tuple[int, int]]:
    return [(i, min(length, i + t)) for i in range(0, length, t)]


def local_softmax(x: np.ndarray, t: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """LS: (X', m', d'); m' and d' are (..., rows, n_sub)."""
    if t < 1:
        raise ValueError(f"sub-vector length T={t} must be >= 1")
    xp = np.empty_like(x)
    parts = _bounds(x.shape[-1], t)
    m = np.empty(x.shape[:-1] + (len(parts),), x.dtype)
    d = np.empty_like(m)
    for j, (a, b) in enumerate(parts):
        mj = x[..., a:b].max(-1)
        safe = np.where(np.isfinite(mj), mj, 0.0)
        xp[..., a:b] = np.exp(x[..., a:b] - safe[..., None])
        m[..., j], d[..., j] = mj, xp[..., a:b].sum(-1)
    return xp, m, d


def inter_reduce(m: np.ndarray, d: np.ndarray) -> np.ndarray:
    """IR: the per-sub-vector factors r' = exp(m' - m) / sum_k exp(m'_k - m) d'_k."""
    top = m.max(-1, keepdims=True)
    w = np.where(np.isfinite(m), np.exp(np.where(np.isfinite(m), m, 0.0) - top), 0.0)
    return w / (w * d).sum(-1, keepdims=True)


def global_scale(xp: np.ndarray, r: np.ndarray, t: int) -> np.ndarray:
    """GS: y = X' scaled by its sub-vector's factor."""
    y = np.empty_like(xp)
    for j, (a, b) in enumerate(_bounds(xp.shape[-1], t)):
        y[..., a:b] = xp[..., a:b] * r[..., j:j + 1]
    return y


def softmax_sd(x: np.ndarray, t: int) -> np.ndarray:
    """softmax(x) over the last axis as three kernels: LS, IR, GS."""
    xp, m, d = local_softmax(x, t)
    return global_scale(xp, inter_reduce(m, d), t)


def attention_sdf(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, t: int,
                  mask: np.ndarray | None, dropped: np.ndarray | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(o, y): QK^T with LS in its epilogue (one T-wide output tile at a time), IR, then the
    V GEMM with GS in its prologue. `mask` (bool, True = keep) and `dropped` (the scaled
    dropout keep-mask applied to y before the V GEMM) broadcast to the scores."""
    length = k.shape[-2]
    parts = _bounds(length, t)
    xp = np.empty(q.shape[:-1] + (length,), q.dtype)
    m = np.empty(q.shape[:-1] + (len(parts),), q.dtype)
    d = np.empty_like(m)
    for j, (a, b) in enumerate(parts):               # score GEMM, tile by tile, LS epilogue
        s = (q @ k[..., a:b, :].swapaxes(-1, -2)) * scale
        if mask is not None:
            s = np.where(mask[..., a:b], s, -np.inf)
        tile, m[..., j:j + 1], d[..., j:j + 1] = local_softmax(s, b - a)
        xp[..., a:b] = tile
    r = inter_reduce(m, d)
    o = np.zeros(q.shape[:-1] + (v.shape[-1],), q.dtype)
    y = np.empty_like(xp)
    for j, (a, b) in enumerate(parts):               # V GEMM with the GS prologue
        y[..., a:b] = xp[..., a:b] * r[..., j:j + 1]
        lhs = y[..., a:b] if dropped is None else y[..., a:b] * dropped[..., a:b]
        o += lhs @ v[..., a:b, :]
    return o, y

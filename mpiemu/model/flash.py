"""FlashAttention-2 numerics (Dao 2023, Alg. 1 and 2): attention one (query block, key block)
at a time with an online softmax, never materializing the scores.

The forward keeps a running row max and sum per query block and rescales its accumulator,
and saves only o and the row log-sum-exp; the backward recomputes each block's
probabilities from the log-sum-exp, with D = rowsum(dO * o). The dropout keep-mask is
regenerated (`keep()`), not stored. q, k, v, o are (B, heads, S, head_dim); equal to dense
attention, forward and every gradient, to rounding (tests/test_model_ops.py).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

KeepFn = Callable[[], np.ndarray | None]       # regenerates the (B, heads, S, S) keep-mask


def _t(x: np.ndarray) -> np.ndarray:
    return x.swapaxes(-1, -2)


def causal_scores(s: np.ndarray, q0: int, k0: int) -> np.ndarray:
    """Scores with key positions after the query position set to -inf."""
    rows = np.arange(q0, q0 + s.shape[-2])[:, None]
    cols = np.arange(k0, k0 + s.shape[-1])[None, :]
    return np.where(cols <= rows, s, -np.inf)


def _blocks(n: int, b: int) -> list[tuple[int, int]]:
    return [(i, min(n, i + b)) for i in range(0, n, b)]


def _pairs(seq: int, block: int, causal: bool) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(query block, key block) pairs that hold at least one unmasked score."""
    bl = _blocks(seq, block)
    return [(qb, kb) for qb in bl for kb in bl if not causal or kb[0] < qb[1]]


def flash_forward(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool, keep: KeepFn,
              p: float, block: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Same o as dense attention, one (query block, key block) at a time, online softmax."""
    scale = 1.0 / float(np.sqrt(q.shape[-1]))
    mask = keep() if p > 0 else None
    o = np.empty(q.shape[:-1] + v.shape[-1:], q.dtype)      # a value head may be narrower
    lse = np.empty(q.shape[:-1], q.dtype)
    seq = q.shape[-2]
    for q0, q1 in _blocks(seq, block):
        m = np.full(q.shape[:-2] + (q1 - q0, 1), -np.inf, q.dtype)
        denom = np.zeros_like(m)
        acc = np.zeros(q.shape[:-2] + (q1 - q0, v.shape[-1]), q.dtype)
        for k0, k1 in _blocks(seq, block):
            if causal and k0 >= q1:
                break
            s = (q[..., q0:q1, :] @ _t(k[..., k0:k1, :])) * scale
            if causal:
                s = causal_scores(s, q0, k0)
            m_new = np.maximum(m, s.max(-1, keepdims=True))
            e = np.exp(s - m_new)
            corr = np.exp(m - m_new)
            denom = denom * corr + e.sum(-1, keepdims=True)
            if mask is not None:
                e *= mask[..., q0:q1, k0:k1]
                e *= 1.0 / (1.0 - p)
            acc = acc * corr + e @ v[..., k0:k1, :]
            m = m_new
        o[..., q0:q1, :] = acc / denom
        lse[..., q0:q1] = (m + np.log(denom))[..., 0]
    return o, {"q": q, "k": k, "v": v, "lse": lse}


def flash_backward(do: np.ndarray, o: np.ndarray, c: dict[str, np.ndarray], causal: bool,
                   keep: KeepFn, p: float, block: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dq, dk, dv), recomputing each block's probabilities from the saved log-sum-exp."""
    q, k, v, lse = c["q"], c["k"], c["v"], c["lse"]
    scale = 1.0 / float(np.sqrt(q.shape[-1]))
    mask = keep() if p > 0 else None
    delta = (do * o).sum(-1)                       # rowsum(dO * O) = rowsum(P * dP)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for (q0, q1), (k0, k1) in _pairs(q.shape[-2], block, causal):
        s = (q[..., q0:q1, :] @ _t(k[..., k0:k1, :])) * scale
        if causal:
            s = causal_scores(s, q0, k0)
        probs = np.exp(s - lse[..., q0:q1, None])
        dropped = probs
        dprobs = do[..., q0:q1, :] @ _t(v[..., k0:k1, :])
        if mask is not None:
            kp = mask[..., q0:q1, k0:k1] * (1.0 / (1.0 - p))
            dropped = probs * kp
            dprobs *= kp
        dv[..., k0:k1, :] += _t(dropped) @ do[..., q0:q1, :]
        ds = probs * (dprobs - delta[..., q0:q1, None]) * scale
        dq[..., q0:q1, :] += ds @ k[..., k0:k1, :]
        dk[..., k0:k1, :] += _t(ds) @ q[..., q0:q1, :]
    return dq, dk, dv

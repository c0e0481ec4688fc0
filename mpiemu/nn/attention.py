"""Multi-head attention of one rank's heads: dense, or blockwise with an online softmax.

q, k, v, o are (B, heads, S, head_dim). Dense materializes the S x S scores (thesis 2.2.2:
score BGEMM, Scale, Mask, DR, Softmax, weighted-sum BGEMM) and keeps softmax output, dropout
mask and dropped probabilities for backward, as Megatron does. Blockwise walks key blocks with
a running max and sum (online softmax, FlashAttention-2), keeps only o and the row
log-sum-exp, and recomputes the probabilities block by block in backward; its dropout mask is
regenerated from the seed, not stored. Both compute the same numbers.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..hw.cost import ComputeModel
from ..sim import ops as sim_ops
from ..sim.timeline import Timeline
from .ops import MASK_BYTES, STAT_BYTES, Cost

KeepFn = Callable[[], np.ndarray | None]       # regenerates the (B, heads, S, S) keep-mask
SOFTMAX_FLOPS = 5      # ASSUMPTION: scale, mask, max, exp, normalize per score
ONLINE_FLOPS_FWD, ONLINE_FLOPS_BWD = 8, 10     # ASSUMPTION: online-softmax work per score


def _causal(s: np.ndarray, q0: int, k0: int) -> np.ndarray:
    """Scores with key positions after the query position set to -inf."""
    rows = np.arange(q0, q0 + s.shape[-2])[:, None]
    cols = np.arange(k0, k0 + s.shape[-1])[None, :]
    return np.where(cols <= rows, s, -np.inf)


def _t(x: np.ndarray) -> np.ndarray:
    return x.swapaxes(-1, -2)


def dense(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool,
          keep: np.ndarray | None, p: float) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """o = DR(softmax(q k^T / sqrt(d) + mask)) v."""
    s = (q @ _t(k)) * (1.0 / np.sqrt(q.shape[-1]))
    if causal:
        s = _causal(s, 0, 0)
    s -= s.max(-1, keepdims=True)
    probs = np.exp(s, out=s)
    probs /= probs.sum(-1, keepdims=True)
    cache = {"q": q, "k": k, "v": v, "probs": probs}
    dropped = probs
    if keep is not None:
        dropped = probs * keep * (1.0 / (1.0 - p))
        cache.update(keep=keep, dropped=dropped)
    return dropped @ v, cache


def dense_back(do: np.ndarray, c: dict[str, np.ndarray], p: float
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dq, dk, dv) of `dense`."""
    probs, keep = c["probs"], c.get("keep")
    dv = _t(c.get("dropped", probs)) @ do
    dprobs = do @ _t(c["v"])
    if keep is not None:
        dprobs *= keep
        dprobs *= 1.0 / (1.0 - p)
    ds = probs * (dprobs - (dprobs * probs).sum(-1, keepdims=True))
    ds *= 1.0 / np.sqrt(c["q"].shape[-1])
    return ds @ c["k"], _t(ds) @ c["q"], dv


def _blocks(n: int, b: int) -> list[tuple[int, int]]:
    return [(i, min(n, i + b)) for i in range(0, n, b)]


def _pairs(seq: int, block: int, causal: bool) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(query block, key block) pairs that hold at least one unmasked score."""
    bl = _blocks(seq, block)
    return [(qb, kb) for qb in bl for kb in bl if not causal or kb[0] < qb[1]]


def blockwise(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool, keep: KeepFn,
              p: float, block: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Same o as `dense`, one (query block, key block) at a time with an online softmax."""
    scale = 1.0 / np.sqrt(q.shape[-1])
    mask = keep() if p > 0 else None
    o = np.empty_like(q)
    lse = np.empty(q.shape[:-1], q.dtype)
    seq = q.shape[-2]
    for q0, q1 in _blocks(seq, block):
        m = np.full(q.shape[:-2] + (q1 - q0, 1), -np.inf, q.dtype)
        denom = np.zeros_like(m)
        acc = np.zeros(q.shape[:-2] + (q1 - q0, q.shape[-1]), q.dtype)
        for k0, k1 in _blocks(seq, block):
            if causal and k0 >= q1:
                break
            s = (q[..., q0:q1, :] @ _t(k[..., k0:k1, :])) * scale
            if causal:
                s = _causal(s, q0, k0)
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


def blockwise_back(do: np.ndarray, o: np.ndarray, c: dict[str, np.ndarray], causal: bool,
                   keep: KeepFn, p: float, block: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dq, dk, dv), recomputing each block's probabilities from the saved log-sum-exp."""
    q, k, v, lse = c["q"], c["k"], c["v"], c["lse"]
    scale = 1.0 / np.sqrt(q.shape[-1])
    mask = keep() if p > 0 else None
    delta = (do * o).sum(-1)                       # rowsum(dO * O) = rowsum(P * dP)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for (q0, q1), (k0, k1) in _pairs(q.shape[-2], block, causal):
        s = (q[..., q0:q1, :] @ _t(k[..., k0:k1, :])) * scale
        if causal:
            s = _causal(s, q0, k0)
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


# -- costs ----------------------------------------------------------------------------------
def charge_dense(tl: Timeline, model: ComputeModel, name: str, batch: int, seq: int,
                 dh: int, e: int, p: float, dtype: str, after: float,
                 backward: bool = False) -> float:
    """Place dense attention's BGEMMs and kernels (thesis Table 4.3 shapes); returns end."""
    scores = batch * seq * seq
    t = after

    def gemm(tag: str, m: int, n: int, k: int) -> None:
        nonlocal t
        t = sim_ops.gemm(tl, model, f"{name}.{tag}", m, n, k, dtype=dtype, after=t,
                         batch=batch).t_end

    def kernel(tag: str, c: Cost) -> None:
        nonlocal t
        t = sim_ops.elementwise(tl, model, f"{name}.{tag}", c.read_bytes, c.write_bytes,
                                c.flops, after=t).t_end

    if not backward:
        gemm("score", seq, seq, dh)
        kernel("softmax", Cost(SOFTMAX_FLOPS * scores, scores * e, scores * e))
        if p > 0:
            kernel("dropout", Cost(scores, scores * e, scores * (e + MASK_BYTES)))
        gemm("context", seq, dh, seq)
        return t
    gemm("dprobs", seq, seq, dh)
    gemm("dv", seq, dh, seq)
    if p > 0:
        kernel("dropout.bwd", Cost(scores, scores * (e + MASK_BYTES), scores * e))
    kernel("softmax.bwd", Cost(3 * scores, 2 * scores * e, scores * e))
    gemm("dq", seq, dh, seq)
    gemm("dk", seq, dh, seq)
    return t


def charge_blockwise(tl: Timeline, model: ComputeModel, name: str, batch: int, seq: int,
                     dh: int, e: int, block: int, causal: bool, dtype: str, after: float,
                     backward: bool = False) -> float:
    """Place the fused online-softmax kernel as its block GEMMs plus its on-chip softmax.

    ASSUMPTION: the fused kernel's matrix work costs as batched block GEMMs (ragged blocks
    padded to full tiles); scores never reach DRAM, which only sees q, k, v, o (and dO, dq,
    dk, dv, lse): k and v are re-read once per query block.
    """
    pairs = len(_pairs(seq, block, causal))
    n_q = len(_blocks(seq, block))
    bb = batch * pairs
    io = batch * seq * dh * e
    gemms = [("score", block, block, dh), ("context", block, dh, block)]
    c = Cost(ONLINE_FLOPS_FWD * bb * block * block, io * (1 + 2 * n_q),
             io + batch * seq * STAT_BYTES)
    if backward:
        gemms = [("score", block, block, dh), ("dprobs", block, block, dh),
                 ("dv", block, dh, block), ("dq", block, dh, block), ("dk", block, dh, block)]
        c = Cost(ONLINE_FLOPS_BWD * bb * block * block,
                 io * (3 + 2 * n_q) + batch * seq * STAT_BYTES, 3 * io)
    t = after
    for tag, m, n, k in gemms:
        t = sim_ops.gemm(tl, model, f"{name}.{tag}", m, n, k, dtype=dtype, after=t,
                         batch=bb).t_end
    return sim_ops.elementwise(tl, model, f"{name}.online_softmax", c.read_bytes,
                               c.write_bytes, c.flops, after=t).t_end

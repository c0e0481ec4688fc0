"""Multi-head attention of one rank's heads: the four variants' numerics.

q, k, v, o are (B, heads, S, head_dim). `baseline` materializes the S x S scores (thesis
2.2.2: score BGEMM, Scale, Mask, DR, Softmax, weighted-sum BGEMM) and keeps the softmax
output, dropout mask and dropped probabilities for backward, as Megatron does. `sd` computes
the same softmax as LS, IR and GS kernels and `sdf` fuses LS into the score GEMM and GS into
the V GEMM (`softmax_recompose`); both keep the same tensors and share the baseline's
backward (seed 004 2.8). `flash` is FlashAttention-2 (`flash`). Every variant computes the
same numbers; what differs is the kernels an executor charges (`devices.attention_gpu`).
"""
from __future__ import annotations

import numpy as np

from .flash import KeepFn, causal_scores, flash_backward, flash_forward
from .softmax_recompose import attention_sdf, softmax_sd

__all__ = ["KeepFn", "dense", "dense_back", "flash_backward", "flash_forward", "forward"]


def _t(x: np.ndarray) -> np.ndarray:
    return x.swapaxes(-1, -2)


def dense(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool,
          keep: np.ndarray | None, p: float, variant: str = "baseline", sub: int = 0
          ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """o = DR(softmax(q k^T / sqrt(d) + mask)) v, the softmax as `variant` computes it
    (`sub`: the sub-vector length T of sd / sdf)."""
    scale = 1.0 / float(np.sqrt(q.shape[-1]))
    drop = None if keep is None else keep.astype(q.dtype) * (1.0 / (1.0 - p))
    if variant == "sdf":
        mask = np.tril(np.ones((q.shape[-2], k.shape[-2]), bool)) if causal else None
        o, probs = attention_sdf(q, k, v, scale, sub, mask, drop)
    else:
        s = (q @ _t(k)) * scale
        if causal:
            s = causal_scores(s, 0, 0)
        if variant == "sd":
            probs = softmax_sd(s, sub)
        else:
            s -= s.max(-1, keepdims=True)
            probs = np.exp(s, out=s)
            probs /= probs.sum(-1, keepdims=True)
        o = (probs if drop is None else probs * drop) @ v
    cache = {"q": q, "k": k, "v": v, "probs": probs}
    if keep is not None:
        cache.update(keep=keep, dropped=probs * drop)
    return o, cache


def dense_back(do: np.ndarray, c: dict[str, np.ndarray], p: float
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dq, dk, dv) of `dense` (any of baseline, sd, sdf): the softmax gradient from y."""
    probs, keep = c["probs"], c.get("keep")
    dv = _t(c.get("dropped", probs)) @ do
    dprobs = do @ _t(c["v"])
    if keep is not None:
        dprobs *= keep
        dprobs *= 1.0 / (1.0 - p)
    ds = probs * (dprobs - (dprobs * probs).sum(-1, keepdims=True))
    ds *= 1.0 / float(np.sqrt(c["q"].shape[-1]))
    return ds @ c["k"], _t(ds) @ c["q"], dv


def forward(variant: str, q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool,
            keep: KeepFn, p: float, block: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The variant's forward: (o, what its backward needs). `block` is the block width of
    blockwise attention (`model.attention_block`): flash's query and key blocks, the
    sub-vector length T of sd / sdf's recomposed softmax."""
    if variant == "flash":
        return flash_forward(q, k, v, causal, keep, p, block)
    return dense(q, k, v, causal, keep(), p, variant, block)

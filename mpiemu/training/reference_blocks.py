"""Building blocks of the one-process reference: norms, activations, rotary positions, Adam
and LAMB.

Plain numpy, batch-first ([B, S, H] or [B, heads, S, head_dim]), each forward paired with a
hand-written backward. Written independently of the sharded layers (`mpiemu.model`), like
the reference itself; only the normal CDF of the erf GeLU is shared (`special`).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..model.config import ModelConfig
from ..model.special import norm_cdf, norm_pdf
from .config import CLIP_EPS, OptimizerConfig

Cache = dict[str, Any]


def wgrad(x: np.ndarray, d: np.ndarray) -> np.ndarray:
    """sum over batch and positions of x^T d: [B, S, I], [B, S, J] -> [I, J]."""
    return x.reshape(-1, x.shape[-1]).T @ d.reshape(-1, d.shape[-1])


# -- norms over the last axis --------------------------------------------------------------
def layer_norm(x: np.ndarray, g: np.ndarray, b: np.ndarray, eps: float
               ) -> tuple[np.ndarray, Cache]:
    """LayerNorm: (x - mean) / sqrt(var + eps) * g + b."""
    mu = x.mean(-1, keepdims=True)
    xc = x - mu
    rstd = 1.0 / np.sqrt((xc * xc).mean(-1, keepdims=True) + eps)
    xhat = xc * rstd
    return xhat * g + b, {"xhat": xhat, "rstd": rstd, "g": g}


def layer_norm_back(dy: np.ndarray, c: Cache) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of `layer_norm`: (dx, dg, db)."""
    xhat, rstd = c["xhat"], c["rstd"]
    axes = tuple(range(dy.ndim - 1))
    dg, db = (dy * xhat).sum(axes), dy.sum(axes)
    dxhat = dy * c["g"]
    dx = rstd * (dxhat - dxhat.mean(-1, keepdims=True)
                 - xhat * (dxhat * xhat).mean(-1, keepdims=True))
    return dx, dg, db


def rms_norm(x: np.ndarray, g: np.ndarray, eps: float) -> tuple[np.ndarray, Cache]:
    """RMSNorm (Zhang & Sennrich 2019, Llama): x / sqrt(mean(x^2) + eps) * g, no centring,
    no bias."""
    rstd = 1.0 / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    xhat = x * rstd
    return xhat * g, {"xhat": xhat, "rstd": rstd, "g": g}


def rms_norm_back(dy: np.ndarray, c: Cache) -> tuple[np.ndarray, np.ndarray]:
    """Gradients of `rms_norm`: (dx, dg). With xhat = x * rstd,
    dx = rstd * (dxhat - xhat * mean(dxhat * xhat)), the LayerNorm formula without the
    mean term (no centring)."""
    xhat, rstd = c["xhat"], c["rstd"]
    dg = (dy * xhat).sum(tuple(range(dy.ndim - 1)))
    dxhat = dy * c["g"]
    dx = rstd * (dxhat - xhat * (dxhat * xhat).mean(-1, keepdims=True))
    return dx, dg


# -- activations ---------------------------------------------------------------------------
def gelu(f: np.ndarray) -> np.ndarray:
    """The erf GeLU f * Phi(f) (thesis Eq. 4.1)."""
    return f * norm_cdf(f)


def gelu_grad(f: np.ndarray) -> np.ndarray:
    """d gelu / df = Phi(f) + f * phi(f)."""
    return norm_cdf(f) + f * norm_pdf(f)


def sigmoid(z: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-z)), evaluated without overflow: exp of -|z| only."""
    e = np.exp(-np.abs(z))
    return np.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def silu(z: np.ndarray) -> np.ndarray:
    """SiLU (swish): z * sigmoid(z), the gate of SwiGLU."""
    return z * sigmoid(z)


def silu_grad(z: np.ndarray) -> np.ndarray:
    """d silu / dz = s + z s (1 - s) with s = sigmoid(z)."""
    s = sigmoid(z)
    return s * (1.0 + z * (1.0 - s))


# -- rotary position embedding (rotate-half convention) ------------------------------------
def rope_frequencies(cfg: ModelConfig, dim: int = 0) -> np.ndarray:
    """The d/2 rotary frequencies theta^(-2i/d) (float64), with Llama 3.1's scaling when
    `cfg.rope_scaling` > 0 (Meta llama-models `apply_scaling`): frequencies whose wavelength
    is below old/high are kept, those above old/low divided by the factor, and those in
    between blended linearly in old/wavelength. `dim`: the rotated width (0: head_dim)."""
    d = dim or cfg.head_dim
    f = cfg.rope_theta ** (-2.0 * np.arange(d // 2, dtype=np.float64) / d)
    if cfg.rope_scaling <= 0:
        return f
    factor, low, high = cfg.rope_scaling, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor
    old = float(cfg.rope_original_max)
    wavelen = 2.0 * math.pi / f
    smooth = (old / wavelen - low) / (high - low)
    blended = (1.0 - smooth) * f / factor + smooth * f
    return np.where(wavelen < old / high, f, np.where(wavelen > old / low, f / factor, blended))


def rope_tables(cfg: ModelConfig, seq: int, dtype: type, dim: int = 0
                ) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [S, d] for positions 0..S-1, each half of a head repeating the d/2
    angles p * f_i; angles in float64, then cast to the run's dtype."""
    angles = np.outer(np.arange(seq, dtype=np.float64), rope_frequencies(cfg, dim))  # (S, d/2)
    angles = np.concatenate([angles, angles], axis=-1)                           # (S, d)
    return np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)


def rotate_half(x: np.ndarray) -> np.ndarray:
    """concat(-x2, x1) over the last axis, x1 and x2 its two halves."""
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate each head vector of x [B, heads, S, d] by its position: x cos + rot(x) sin."""
    return x * cos + rotate_half(x) * sin


def apply_rope_back(dy: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Gradient of `apply_rope`: the transpose of rotate_half is -rotate_half, so
    dx = dy cos - rot(dy sin) (the inverse rotation)."""
    return dy * cos - rotate_half(dy * sin)


# -- softmax attention over heads ----------------------------------------------------------
def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool,
              mask: np.ndarray | None) -> tuple[np.ndarray, Cache]:
    """o = DR(softmax(q k^T / sqrt(d) + causal mask)) v on heads [B, n, S, d] (v's heads may
    be narrower: MLA), `mask` the dropout's scaled keep-mask; and the cache of
    `attention_back`."""
    s = q.shape[-2]
    scores = (q @ k.transpose(0, 1, 3, 2)) / float(np.sqrt(q.shape[-1]))      # (B, n, S, S)
    if causal:
        scores = np.where(np.tril(np.ones((s, s), bool)), scores, -np.inf)
    e = np.exp(scores - scores.max(-1, keepdims=True))
    probs = e / e.sum(-1, keepdims=True)
    dropped = probs if mask is None else probs * mask
    return dropped @ v, {"q": q, "k": k, "v": v, "probs": probs, "mask": mask,
                         "dropped": dropped}


def attention_back(do: np.ndarray, c: Cache) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dq, dk, dv) of `attention` from its output's gradient do [B, n, S, dv]."""
    dv = c["dropped"].transpose(0, 1, 3, 2) @ do
    ddropped = do @ c["v"].transpose(0, 1, 3, 2)
    dprobs = ddropped if c["mask"] is None else ddropped * c["mask"]
    probs = c["probs"]
    dscores = probs * (dprobs - (dprobs * probs).sum(-1, keepdims=True)) / \
        float(np.sqrt(c["q"].shape[-1]))
    return dscores @ c["k"], dscores.transpose(0, 1, 3, 2) @ c["q"], dv


# -- grouped-query attention ---------------------------------------------------------------
def repeat_kv(t: np.ndarray, rep: int) -> np.ndarray:
    """Each KV head once per query head of its group: [B, g, S, d] -> [B, g*rep, S, d];
    query head i reads KV head i // rep."""
    return t if rep == 1 else np.repeat(t, rep, axis=1)


def sum_kv(d: np.ndarray, rep: int) -> np.ndarray:
    """Gradient of `repeat_kv`: the query heads of a group summed, [B, g*rep, S, d] ->
    [B, g, S, d]."""
    if rep == 1:
        return d
    bsz, nh, s, dh = d.shape
    return d.reshape(bsz, nh // rep, rep, s, dh).sum(2)        # (B, g, S, d)


def adam_or_lamb(params: dict[str, np.ndarray], grads: dict[str, np.ndarray],
                 m_: dict[str, np.ndarray], v_: dict[str, np.ndarray], o: OptimizerConfig,
                 t: int) -> None:
    """Step t of Adam (decoupled weight decay on matrices) or LAMB on every parameter, in
    place, after clipping by the global norm where the optimizer asks for it."""
    if o.needs_global_norm or o.name == "lamb":
        norm = float(np.sqrt(sum(float((gr * gr).sum()) for gr in grads.values())))
        if o.clip_grad_norm > 0:
            coeff = o.clip_grad_norm / (norm + CLIP_EPS)
            if coeff < 1.0:
                grads = {k: gr * coeff for k, gr in grads.items()}
    for name, w in params.items():
        gr = grads[name]
        m, v = m_[name], v_[name]
        m *= o.beta1
        m += (1.0 - o.beta1) * gr
        v *= o.beta2
        v += (1.0 - o.beta2) * gr * gr
        step = (m / (1.0 - o.beta1 ** t)) / (np.sqrt(v / (1.0 - o.beta2 ** t)) + o.eps)
        if w.ndim == 2 and o.weight_decay > 0:
            step = step + o.weight_decay * w
        if o.name == "lamb":
            wn, sn = float(np.sqrt((w * w).sum())), float(np.sqrt((step * step).sum()))
            step = step * (wn / sn if wn > 0 and sn > 0 else 1.0)
        w -= o.lr * step

"""The one-process reference's multi-head latent attention (DeepSeek-V3 report 2.1.1), batch
first [B, S, H], written apart from the sharded `model.latent_attention`:

    c_q = RMSNorm(x W_dq),  q = c_q W_uq                  (or q = x W_q without a latent)
    [c_kv | k_r] = x W_dkv,  [k_c | v] = RMSNorm(c_kv) W_ukv
    q_i = [q_c,i | RoPE(q_r,i)],  k_i = [k_c,i | RoPE(k_r)]   (k_r shared by the heads)
    o_i = softmax(q_i k_i^T / sqrt(dh + dr) + mask) v_i,  out = [o_1 .. o_n] W_o
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .reference_blocks import (Cache, apply_rope, apply_rope_back, attention, attention_back,
                               rms_norm, rms_norm_back)

Grads = dict[str, np.ndarray]


def mla_forward(ref: Any, x: np.ndarray, i: int, it: int) -> tuple[np.ndarray, Cache]:
    """out [B, S, H] of layer i's MLA and what its backward needs (`ref`: a `Reference`)."""
    cfg, p, pre = ref.cfg, ref.params, f"layers.{i}.attn."
    bsz, s, _ = x.shape
    n, dn, dr, dv, kvl = cfg.heads, cfg.head_dim, cfg.qk_rope_dim, cfg.v_dim, cfg.kv_lora_rank
    c: Cache = {"x": x}
    if cfg.q_lora_rank:
        cq, c["q_ln"] = rms_norm(ref._linear(x, pre + "wq_down", ""), p[pre + "q_ln.g"],
                                 cfg.layernorm_eps)
        c["cq"] = cq = ref.mm.round(cq)
        q = ref._linear(cq, pre + "wq_up", "")
    else:
        q = ref._linear(x, pre + "wq", "")
    ckv = ref._linear(x, pre + "wkv_down", "")
    lat, c["kv_ln"] = rms_norm(ckv[..., :kvl], p[pre + "kv_ln.g"], cfg.layernorm_eps)
    c["lat"] = lat = ref.mm.round(lat)
    kv = ref._linear(lat, pre + "wkv_up", "").reshape(bsz, s, n, dn + dv).transpose(0, 2, 1, 3)
    q = q.reshape(bsz, s, n, dn + dr).transpose(0, 2, 1, 3)                  # (B, n, S, .)
    cos, sin = ref.rope[0][:s], ref.rope[1][:s]                               # (S, dr)
    q = np.concatenate([q[..., :dn], apply_rope(q[..., dn:], cos, sin)], axis=-1)
    kr = apply_rope(ckv[:, None, :, kvl:], cos, sin)                          # (B, 1, S, dr)
    k = np.concatenate([kv[..., :dn], np.broadcast_to(kr, (bsz, n, s, dr))], axis=-1)
    q, k, v = (ref.mm.round(t) for t in (q, k, kv[..., dn:]))
    o, core = attention(q, k, v, cfg.causal, ref._probs_mask(it, i))
    c.update(core, o=ref.mm.round(o.transpose(0, 2, 1, 3).reshape(bsz, s, n * dv)))
    return ref._linear(c["o"], pre + "wo", ""), c


def mla_backward(ref: Any, dout: np.ndarray, c: Cache, i: int, g: Grads) -> np.ndarray:
    """dx [B, S, H] of `mla_forward`; the weights' and gains' gradients into g."""
    cfg, pre = ref.cfg, f"layers.{i}.attn."
    bsz, s, _ = dout.shape
    n, dn, dv = cfg.heads, cfg.head_dim, cfg.v_dim
    ref._linear_back(c["o"], dout, pre + "wo", "", g)
    do = ref._dgrad(pre + "wo", dout).reshape(bsz, s, n, dv).transpose(0, 2, 1, 3)
    dq, dk, dvv = (ref.mm.round(t) for t in attention_back(do, c))          # (B, n, S, .)
    cos, sin = ref.rope[0][:s], ref.rope[1][:s]
    dq = np.concatenate([dq[..., :dn], apply_rope_back(dq[..., dn:], cos, sin)], axis=-1)
    dkr = apply_rope_back(dk[..., dn:].sum(1), cos, sin)                       # (B, S, dr)
    dkv = np.concatenate([dk[..., :dn], dvv], axis=-1).transpose(0, 2, 1, 3).reshape(bsz, s, -1)
    dq = dq.transpose(0, 2, 1, 3).reshape(bsz, s, -1)
    ref._linear_back(c["lat"], dkv, pre + "wkv_up", "", g)
    dlat, g[pre + "kv_ln.g"] = rms_norm_back(ref._dgrad(pre + "wkv_up", dkv), c["kv_ln"])
    dckv = np.concatenate([ref.mm.round(dlat), dkr], axis=-1)
    ref._linear_back(c["x"], dckv, pre + "wkv_down", "", g)
    dx = ref._dgrad(pre + "wkv_down", dckv)
    if not cfg.q_lora_rank:
        ref._linear_back(c["x"], dq, pre + "wq", "", g)
        return dx + ref._dgrad(pre + "wq", dq)
    ref._linear_back(c["cq"], dq, pre + "wq_up", "", g)
    dcq, g[pre + "q_ln.g"] = rms_norm_back(ref._dgrad(pre + "wq_up", dq), c["q_ln"])
    dcq = ref.mm.round(dcq)
    ref._linear_back(c["x"], dcq, pre + "wq_down", "", g)
    return dx + ref._dgrad(pre + "wq_down", dcq)

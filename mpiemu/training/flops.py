"""Model and hardware FLOPs of one training iteration, as the Megatron-LM papers count them.

Only GEMMs count (Korthikanti et al. 2022, Appendix A; Narayanan et al. 2021, 5.1): per
token and layer the forward runs 2(3h h + h h + 2 h f) for QKV, projection and the MLP and
2(2 s h) for the scores and the attention over V (no causal discount), plus 2 h V for the
logits; backward costs twice the forward. With f = 4h this is Eq. 7,
72 B s L h^2 (1 + s/(6h) + V/(12 h L)). Hardware FLOPs add what recomputation runs again,
as the papers count it: selective, Eq. 8, 72 B s L h^2 (1 + s/(3h) + V/(12 h L)), i.e.
three times the attention core's forward GEMMs more (the recomputed forward GEMMs alone
are one time: Eq. 8 is what Megatron's HFU figures use, so we follow it); full, every
layer's forward again (Narayanan et al. 2021 Eq. 3, 96 B s L h^2 (1 + s/(6h) +
V/(16 h L))). MFU = model FLOPs / (time x devices x peak), HFU the same with hardware FLOPs.
Llama-family blocks count as Megatron-Core's `num_floating_point_operations` does
(megatron/training/training.py): QKV 2 h (h + 2 h_kv) with grouped-query attention, the MLP
2 h f g with g = 3 for SwiGLU (gate, up, down) and 2 otherwise; the attention core as above.
Heads of their own width (`kv_channels`, Qwen3) count as there too: its
`query_projection_size = args.kv_channels * args.num_attention_heads` (a d) scales the QKV
GEMM, 2 h (a d + 2 g d) with g KV heads, the output projection, 2 a d h, and the attention
core, 2 x 2 s a d per token (a d = h otherwise, so every other model counts as before);
QK-norm is not a GEMM and is not counted.
Multi-head latent attention (DeepSeek-V3) counts its GEMMs' weights, 2 x (the query's down
and up projections, or its one projection; the KV latent's down projection with the shared
rotated key, its up projection; the output projection), and the attention core as
2 s a (d_qk + d_v) per token (QK^T over query / key heads of d_qk = head_dim + rotated
dims, PV over value heads of d_v), without a causal discount as above.
An MoE layer's MLP counts the experts a token passes, 2 h g (k f_e + f_shared), the router
not counted (as there: routed experts x moe_ffn_hidden_size, plus the shared experts).
"""
from __future__ import annotations

from ..model.config import ModelConfig


def layer_forward_flops(cfg: ModelConfig, tokens: int, layer: int = 0
                        ) -> tuple[float, float]:
    """(GEMM FLOPs of layer `layer`'s forward, of which the attention core) for `tokens`."""
    h, f, s = cfg.hidden, cfg.ffn_hidden, cfg.seq_len
    q = cfg.attn_width                                   # heads x head_dim (= h by default)
    kv = cfg.groups * cfg.head_dim                       # K and V widths (GQA: fewer heads)
    m = cfg.moe
    if m is not None and m.is_moe(layer):
        f = m.top_k * m.expert_ffn + m.shared_ffn
    mlp = (3 if cfg.gated else 2) * h * f
    if cfg.mla:
        core = 2.0 * s * cfg.heads * (cfg.qk_head_dim + cfg.v_dim) * tokens
        return 2.0 * (latent_weights(cfg) + mlp) * tokens + core, core
    core = 2.0 * 2 * s * q * tokens
    return 2.0 * (h * (q + 2 * kv) + q * h + mlp) * tokens + core, core


def latent_weights(cfg: ModelConfig) -> int:
    """Elements of MLA's GEMM weights (a token's multiply-adds through them)."""
    h, n, ql, kvl = cfg.hidden, cfg.heads, cfg.q_lora_rank, cfg.kv_lora_rank
    q = ql * (h + n * cfg.qk_head_dim) if ql else h * n * cfg.qk_head_dim
    kv = h * (kvl + cfg.qk_rope_dim) + kvl * n * (cfg.head_dim + cfg.v_dim)
    return q + kv + n * cfg.v_dim * h


def model_flops(cfg: ModelConfig, global_batch: int) -> float:
    """Forward + backward GEMM FLOPs of one iteration (Korthikanti et al. 2022 Eq. 7)."""
    tokens = global_batch * cfg.seq_len
    return 3.0 * (_layers_forward(cfg, tokens)[0] + 2.0 * cfg.hidden * cfg.padded_vocab * tokens)


def _layers_forward(cfg: ModelConfig, tokens: int) -> tuple[float, float]:
    """(every layer's forward GEMM FLOPs, their attention cores'): dense layers alike."""
    dense, core = layer_forward_flops(cfg, tokens)
    if cfg.moe is None:
        return cfg.layers * dense, cfg.layers * core
    k = cfg.moe.dense_layers
    moe, _ = layer_forward_flops(cfg, tokens, k)
    return k * dense + (cfg.layers - k) * moe, cfg.layers * core


def hardware_flops(cfg: ModelConfig, global_batch: int, recompute: str) -> float:
    """Model FLOPs plus what recomputation runs again (Korthikanti Eq. 8; Narayanan Eq. 3)."""
    tokens = global_batch * cfg.seq_len
    layers, cores = _layers_forward(cfg, tokens)
    extra = {"none": 0.0, "selective": 3.0 * cores, "full": layers}[recompute]
    return model_flops(cfg, global_batch) + extra


def utilization(flops: float, iteration_s: float, devices: int, peak_flops_per_s: float
                ) -> float:
    """Achieved share of the devices' peak: flops / (time x devices x peak)."""
    return flops / (iteration_s * devices * peak_flops_per_s)

"""Megatron-LM's FLOP counts for MFU and HFU, from our general per-GEMM sum."""
from __future__ import annotations

import pytest

from mpiemu.training.flops import hardware_flops, model_flops, utilization
from mpiemu.model.presets import load_model_preset


@pytest.mark.parametrize("name, batch", [("megatron-22b", 4), ("megatron-175b", 64),
                                         ("megatron-530b", 280), ("megatron-1t", 512)])
def test_model_and_hardware_flops_are_the_papers_formulas(name: str, batch: int) -> None:
    cfg = load_model_preset(name).config
    B, s, L, h, V = batch, cfg.seq_len, cfg.layers, cfg.hidden, cfg.padded_vocab
    eq7 = 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * h * L))    # Korthikanti Eq. 7
    eq8 = 72 * B * s * L * h * h * (1 + s / (3 * h) + V / (12 * h * L))    # Korthikanti Eq. 8
    eq3 = 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))    # Narayanan Eq. 3
    assert model_flops(cfg, B) == pytest.approx(eq7, rel=1e-12)
    assert hardware_flops(cfg, B, "none") == pytest.approx(eq7, rel=1e-12)
    assert hardware_flops(cfg, B, "selective") == pytest.approx(eq8, rel=1e-12)
    assert hardware_flops(cfg, B, "full") == pytest.approx(eq3, rel=1e-12)


def test_utilization_is_flops_over_time_devices_and_peak() -> None:
    assert utilization(312e12 * 8 * 2.0 * 0.5, 2.0, 8, 312e12) == pytest.approx(0.5)


def test_llama_flops_count_grouped_query_attention_and_swiglu() -> None:
    """Llama 3 8B at s = 8192: 57.91 GFLOP per token with the attention core counted whole
    (torchtitan's and PaLM App. B's count, 6 N_matmul + 12 L h s; Megatron-Core, which halves
    the core for the causal mask, gives 51.47: modern_training.md 2.2)."""
    cfg = load_model_preset("llama3-8b").config
    per_token = model_flops(cfg, 1) / cfg.seq_len
    assert per_token / 1e9 == pytest.approx(57.91, abs=0.005)
    L, h, s = cfg.layers, cfg.hidden, cfg.seq_len
    norms = (2 * L + 1) * h                                    # RMSNorm gains
    n_matmul = cfg.param_count() - cfg.padded_vocab * h - norms    # nor the input embedding
    assert per_token == pytest.approx(6 * n_matmul + 12 * L * h * s, rel=1e-9)


def test_moe_model_flops_count_the_experts_a_token_passes() -> None:
    """Mixtral 8x7B: 6 x the GEMM parameters a token passes (attention, top-2 experts, the
    output layer; not the router) + the attention core's 12 s h per layer, as Megatron-Core's
    num_floating_point_operations counts an MoE model."""
    from mpiemu.model.presets import load_model_preset
    from mpiemu.training.flops import model_flops
    cfg = load_model_preset("mixtral-8x7b").config
    h, L, s, m = cfg.hidden, cfg.layers, cfg.seq_len, cfg.moe
    assert m is not None
    attn = h * (h + 2 * cfg.groups * cfg.head_dim) + h * h
    active = L * (attn + cfg.mlp_params(0, active=True) - h * m.experts) + h * cfg.padded_vocab
    assert model_flops(cfg, 1) / s == 6 * active + 12 * s * h * L


@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "qwen3-235b-a22b"])
def test_qwen3_flops_are_megatron_cores_with_the_query_projection_size(name: str) -> None:
    """Heads of kv_channels 128 (not hidden / heads = 64): Megatron-Core's
    num_floating_point_operations (megatron/training/training.py), whose attention terms
    scale with query_projection_size = kv_channels x num_attention_heads:
    12 B s L h^2 ((1 + g/a + s/h) q/h + (f/h) k 3/2 + V/(2 L h))."""
    cfg = load_model_preset(name).config
    m = cfg.moe
    assert m is not None and cfg.head_dim == 128 and cfg.attn_width == 128 * cfg.heads
    B, s, L, h, V = 1, cfg.seq_len, cfg.layers, cfg.hidden, cfg.padded_vocab
    q, g, a = cfg.kv_channels * cfg.heads, cfg.groups, cfg.heads
    megatron = 12 * B * s * L * h * h * ((1 + g / a + s / h) * q / h
                                         + m.expert_ffn / h * m.top_k * 3 / 2
                                         + V / (2 * L * h))
    assert model_flops(cfg, B) == pytest.approx(megatron, rel=1e-12)

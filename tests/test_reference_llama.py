"""The one-process reference's Llama-family blocks (serial): RMSNorm, SwiGLU, RoPE (with
Llama 3.1's frequency scaling), grouped-query attention, no biases, an untied output layer;
Qwen3's heads of their own width (`kv_channels`) and QK-norm."""
from __future__ import annotations

import ast
import dataclasses
import hashlib
from pathlib import Path

import numpy as np
import pytest

from mpiemu.model import seeded
from mpiemu.model.config import ModelConfig
from mpiemu.model.presets import load_model_preset
from tests.test_reference import central_difference
from mpiemu.training.config import OptimizerConfig
from mpiemu.training.reference import Reference
from mpiemu.training.reference_blocks import apply_rope, rope_frequencies, rope_tables

TINY = load_model_preset("tiny").config
# head_dim 8; padded vocabulary 16 > 13, so the output layer has padding rows
SMALL = dataclasses.replace(TINY, hidden=32, heads=4, ffn_hidden=48, vocab=13, vocab_multiple=8,
                            seq_len=8, layers=2, hidden_dropout=0.0, attention_dropout=0.0)
LLAMA = dict(norm_kind="rmsnorm", activation="swiglu", position="rope", kv_heads=2, bias=False,
             tied_embeddings=False)

CASES = {
    # (a) every Llama switch at once, grouped-query attention with 2 query heads per KV head
    "llama-gqa": dict(LLAMA),
    # (b) multi-query attention and Llama 3.1's RoPE scaling, head_dim 16: with theta 1e4
    # the wavelengths are 2 pi 10^(i/2); old/high = 16, old/low = 64 -> 1 kept, 2 blended, 5 / 8
    "llama-mqa-scaled": dict(LLAMA, kv_heads=1, hidden=64, seq_len=16, rope_scaling=8.0,
                             rope_original_max=64),
    # (c) a mix: RMSNorm in a GPT (GeLU, learned positions, biases, tied)
    "rmsnorm-gpt": dict(norm_kind="rmsnorm"),
    # (d) post-norm RMSNorm in a bidirectional Llama-like encoder with biases
    "post-rmsnorm": dict(LLAMA, norm="post", attention_mask="bidirectional", bias=True),
    # (e) GQA under both dropouts: one probability mask per query head
    "llama-gqa-dropout": dict(LLAMA, hidden_dropout=0.1, attention_dropout=0.1),
    # (f) Qwen3's attention: heads of kv_channels 12 (q 32 -> 48, o 48 -> 32) and QK-norm
    "qwen3-kv-channels-qk-norm": dict(LLAMA, kv_channels=12, qk_norm=True),
    # (g) a hidden size the heads do not divide (30 / 4), heads of 10, QK-norm with dropout
    "qwen3-hidden-not-heads": dict(LLAMA, hidden=30, kv_channels=10, qk_norm=True,
                                   attention_dropout=0.1),
}


def perturbed(cfg: ModelConfig) -> Reference:
    """A reference whose zero biases and unit gains are perturbed, so every gradient flows."""
    ref = Reference(cfg, 3, OptimizerConfig(), 2)
    rng = np.random.default_rng(0)
    for v in ref.params.values():
        v += 0.05 * rng.standard_normal(v.shape)
    return ref


@pytest.mark.parametrize("case", list(CASES))
def test_llama_gradients_equal_central_differences(case: str) -> None:
    cfg = dataclasses.replace(SMALL, **CASES[case])
    ref = perturbed(cfg)
    assert set(ref.params) == {n for n, _, _ in seeded.full_param_specs(cfg)}
    tok, tgt = seeded.batch(cfg, 3, 0, 2)
    _, grads = ref.loss_and_grads(tok, tgt, 0)
    assert set(grads) == set(ref.params)
    rng = np.random.default_rng(1)
    h = 1e-5
    for name, p in ref.params.items():
        assert grads[name].shape == p.shape, name
        # relative to the tensor's largest gradient; 1e-3 floors it where the gradient is
        # (nearly) zero (a key bias without RoPE), above central differences' 2e-11 noise
        scale = max(float(np.abs(grads[name]).max()), 1e-3)
        for _ in range(3):
            i = tuple(int(rng.integers(0, s)) for s in p.shape)
            err = abs(central_difference(ref, tok, tgt, p, i, h) - grads[name][i]) / scale
            assert err < 1e-7, (name, i, err)


def test_gpt_loss_and_gradients_unchanged_by_the_llama_switches() -> None:
    cfg = TINY
    ref = Reference(cfg, 0, OptimizerConfig(), 2)
    tok, tgt = seeded.batch(cfg, 0, 0, 2)
    loss, grads = ref.loss_and_grads(tok, tgt, 0)
    digest = hashlib.sha256()
    for name in sorted(grads):
        digest.update(np.ascontiguousarray(grads[name]).tobytes())
    # the pre-change reference's (git 755a737) loss and gradient digest on this computation
    assert loss == 5.573180320537736
    assert digest.hexdigest() == \
        "a4ecf7cead03c5643dd01c1c5b7bfe69051f9a94d9c7a1a76e8ffb53f2635986"


def test_rope_frequencies_unscaled_and_llama31_bands() -> None:
    cfg = dataclasses.replace(SMALL, position="rope", rope_theta=500000.0)
    d = cfg.head_dim
    want = np.array([500000.0 ** (-(2 * i) / d) for i in range(d // 2)])
    np.testing.assert_allclose(rope_frequencies(cfg), want, rtol=1e-15, atol=0)
    # Llama 3.1 8B: head_dim 128, theta 5e5, factor 8, low 1, high 4, original context 8192
    llama31 = ModelConfig("llama3.1", hidden=4096, layers=1, heads=32, ffn_hidden=14336,
                          vocab=128256, seq_len=16, position="rope", rope_theta=500000.0,
                          rope_scaling=8.0, rope_low_freq_factor=1.0,
                          rope_high_freq_factor=4.0, rope_original_max=8192)
    base = rope_frequencies(dataclasses.replace(llama31, rope_scaling=0.0))
    scaled = rope_frequencies(llama31)
    kept, divided = scaled == base, scaled == base / 8
    blended = (scaled < base) & (scaled > base / 8)
    assert (kept.sum(), divided.sum(), blended.sum()) == (29, 29, 6)
    assert kept[:29].all() and blended[29:35].all() and divided[35:].all()
    # the blend is continuous at both edges: old/wavelen runs from high (4) down to low (1)
    assert np.all(np.diff(scaled) < 0)


def test_rope_scaling_case_covers_all_three_bands() -> None:
    cfg = dataclasses.replace(SMALL, **CASES["llama-mqa-scaled"])
    base = rope_frequencies(dataclasses.replace(cfg, rope_scaling=0.0))
    scaled = rope_frequencies(cfg)
    kept, divided = scaled == base, scaled == base / 8
    assert kept.sum() and divided.sum() and (~kept & ~divided).sum()


def test_rope_is_rotate_half_and_scores_depend_on_relative_position_only() -> None:
    cfg = dataclasses.replace(SMALL, position="rope")
    d, s = cfg.head_dim, cfg.seq_len
    cos, sin = rope_tables(cfg, s, np.float64)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 1, s, d))
    y = apply_rope(x, cos, sin)
    # position p rotates the pair (x_i, x_{i + d/2}) by the angle p f_i
    f = rope_frequencies(cfg)
    p, i = 5, 1
    c, sn = np.cos(p * f[i]), np.sin(p * f[i])
    a, b = x[0, 0, p, i], x[0, 0, p, i + d // 2]
    np.testing.assert_allclose([y[0, 0, p, i], y[0, 0, p, i + d // 2]],
                               [a * c - b * sn, b * c + a * sn], rtol=1e-14)
    np.testing.assert_allclose(y[0, 0, 0], x[0, 0, 0])                  # position 0: identity
    np.testing.assert_allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1))
    q = np.broadcast_to(rng.standard_normal(d), (1, 1, s, d))
    k = np.broadcast_to(rng.standard_normal(d), (1, 1, s, d))
    qr, kr = apply_rope(q, cos, sin)[0, 0], apply_rope(k, cos, sin)[0, 0]
    np.testing.assert_allclose(qr[5] @ kr[2], qr[4] @ kr[1], rtol=1e-12)


def test_grouped_query_attention_equals_attention_with_repeated_kv_heads() -> None:
    """kv_heads = 2 of 4 heads is multi-head attention whose K/V heads 2j and 2j+1 both
    equal KV head j: query head i reads KV head i // 2."""
    gqa_cfg = dataclasses.replace(SMALL, **CASES["llama-gqa"])
    mha_cfg = dataclasses.replace(gqa_cfg, kv_heads=0)
    gqa = Reference(gqa_cfg, 4, OptimizerConfig(), 2)
    mha = Reference(mha_cfg, 4, OptimizerConfig(), 2)
    dh = gqa_cfg.head_dim
    for name, w in gqa.params.items():
        if name.endswith(("attn.wk", "attn.wv")):
            w3 = w.reshape(gqa_cfg.hidden, gqa_cfg.groups, 1, dh)          # (H, groups, 1, dh)
            mha.params[name] = np.repeat(w3, 2, axis=2).reshape(gqa_cfg.hidden, -1)
        else:
            mha.params[name] = w.copy()
    tok, tgt = seeded.batch(gqa_cfg, 4, 0, 2)
    loss_g, grads_g = gqa.loss_and_grads(tok, tgt, 0)
    loss_m, grads_m = mha.loss_and_grads(tok, tgt, 0)
    assert loss_g == pytest.approx(loss_m, rel=1e-13)
    gk = grads_m["layers.1.attn.wk"].reshape(gqa_cfg.hidden, gqa_cfg.groups, 2, dh).sum(2)
    np.testing.assert_allclose(grads_g["layers.1.attn.wk"], gk.reshape(gqa_cfg.hidden, -1),
                               rtol=1e-10, atol=1e-15)


def test_llama_reference_trains_in_float32() -> None:
    cfg = dataclasses.replace(TINY, **dict(LLAMA, rope_scaling=8.0, rope_original_max=8))
    ref = Reference(cfg, 0, OptimizerConfig(lr=3e-3), 4, np.float32)
    losses = [ref.train_step(it) for it in range(4)]
    assert all(v.dtype == np.float32 for v in ref.params.values())
    assert np.isfinite(losses).all() and losses[-1] < losses[0]


def test_the_reference_imports_nothing_of_the_sharded_model() -> None:
    allowed = {"mpiemu.model", "mpiemu.model.seeded", "mpiemu.model.config",
               "mpiemu.model.special"}
    root = Path(__file__).resolve().parents[1] / "mpiemu" / "training"
    for fname in ("reference.py", "reference_blocks.py"):
        for node in ast.walk(ast.parse((root / fname).read_text())):
            if isinstance(node, ast.ImportFrom):
                prefix = {0: "", 1: "mpiemu.training.", 2: "mpiemu."}[node.level]
                full = (prefix + (node.module or "")).rstrip(".")
                names = [f"{full}.{a.name}" for a in node.names]
                if full.startswith("mpiemu.model"):
                    assert full in allowed and (full != "mpiemu.model"
                                                or set(names) <= allowed), (fname, names)
            elif isinstance(node, ast.Import):
                assert not any(a.name.startswith("mpiemu.model") for a in node.names)

"""The one-process reference, presets, seeded data/masks and the shard layout (serial)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from mpiemu.model import seeded
from mpiemu.model.config import ModelConfig
from mpiemu.training.config import OptimizerConfig
from mpiemu.model.dims import Dims
from mpiemu.model.masks import Masks
from mpiemu.model.presets import list_model_presets, load_model_preset
from mpiemu.training.reference import Reference
from mpiemu.model.tensor_parallel import local_params, shard_params, unshard_params

SMALL = dataclasses.replace(load_model_preset("tiny").config, hidden=16, heads=4, ffn_hidden=32,
                            seq_len=6, vocab=11, vocab_multiple=1, layers=2)


def perturbed(cfg: ModelConfig, gb: int = 3) -> Reference:
    """A reference whose zero-initialized biases are perturbed, so every gradient flows."""
    ref = Reference(cfg, 3, OptimizerConfig(), gb)
    rng = np.random.default_rng(0)
    for v in ref.params.values():
        v += 0.05 * rng.standard_normal(v.shape)
    return ref


def central_difference(ref: Reference, tok: np.ndarray, tgt: np.ndarray, p: np.ndarray,
                       i: tuple[int, ...], h: float) -> float:
    """d loss / d p[i] by central differences of step h (p restored after)."""
    old = p[i]
    p[i] = old + h
    lp = ref.loss_and_grads(tok, tgt, 0)[0]
    p[i] = old - h
    lm = ref.loss_and_grads(tok, tgt, 0)[0]
    p[i] = old
    return (lp - lm) / (2 * h)


@pytest.mark.parametrize("norm, mask", [("pre", "causal"), ("post", "bidirectional")])
def test_reference_gradients_equal_finite_differences(norm: str, mask: str) -> None:
    cfg = dataclasses.replace(SMALL, norm=norm, attention_mask=mask)
    ref = perturbed(cfg)
    tok, tgt = seeded.batch(cfg, 3, 0, 3)
    _, grads = ref.loss_and_grads(tok, tgt, 0)
    rng = np.random.default_rng(1)
    h = 1e-5
    for name, p in ref.params.items():
        scale = max(float(np.abs(grads[name]).max()), 1e-3)
        for _ in range(3):
            i = tuple(int(rng.integers(0, s)) for s in p.shape)
            assert abs(central_difference(ref, tok, tgt, p, i, h) - grads[name][i]) \
                < 1e-6 * scale, (name, i)


def test_reference_adam_step_is_the_textbook_update() -> None:
    opt = OptimizerConfig(lr=0.1, weight_decay=0.0, clip_grad_norm=0.0)
    ref = Reference(SMALL, 0, opt, 2)
    w0 = ref.params["wte"].copy()
    g = {k: np.full_like(v, 0.5) for k, v in ref.params.items()}
    ref.update(g)
    # step 1: m_hat = g, v_hat = g^2, so w moves by lr * g / (|g| + eps)
    np.testing.assert_allclose(ref.params["wte"], w0 - 0.1 * 0.5 / (0.5 + 1e-8))


def test_reference_lamb_scales_each_update_to_the_weight_norm() -> None:
    opt = OptimizerConfig(name="lamb", lr=0.01, weight_decay=0.0, clip_grad_norm=0.0)
    ref = Reference(SMALL, 0, opt, 2)
    w0 = ref.params["wte"].copy()
    g = {k: np.full_like(v, 0.25) for k, v in ref.params.items()}
    ref.update(g)
    step = w0 - ref.params["wte"]
    np.testing.assert_allclose(np.linalg.norm(step), 0.01 * np.linalg.norm(w0), rtol=1e-10)


def test_reference_loss_falls_on_the_synthetic_stream() -> None:
    ref = Reference(load_model_preset("tiny").config, 0, OptimizerConfig(lr=3e-3), 8)
    losses = [ref.train_step(it) for it in range(6)]
    assert losses[-1] < losses[0] - 0.1


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("norm", ["pre", "post"])
def test_shards_cover_every_parameter_once_and_round_trip(tp: int, norm: str) -> None:
    cfg = dataclasses.replace(load_model_preset("tiny").config, norm=norm).for_tp(tp)
    full = seeded.init_full_params(cfg, 5)
    shards = [shard_params(full, cfg, tp, r) for r in range(tp)]
    back = unshard_params(shards, cfg)
    assert set(back) == set(full)
    for name in full:
        np.testing.assert_array_equal(back[name], full[name])
    split = sum(lp.size for lp in local_params(cfg, tp) if lp.tp_split)
    rep = sum(lp.size for lp in local_params(cfg, tp) if not lp.tp_split)
    assert tp * split + rep == cfg.param_count()


def test_qkv_shard_holds_the_ranks_heads_of_q_k_and_v() -> None:
    cfg = load_model_preset("tiny").config.for_tp(2)
    full = seeded.init_full_params(cfg, 0)
    local = shard_params(full, cfg, 2, 1)["layers.0.qkv.w"]
    half = cfg.hidden // 2
    np.testing.assert_array_equal(local[:, half:2 * half], full["layers.0.attn.wk"][:, half:])


def test_every_preset_loads_with_a_source_for_every_number() -> None:
    names = list_model_presets()
    assert {"tiny", "bert-large", "mega-gpt2", "t-nlg", "gpt3-6.7b", "gpt3-13b", "gpt3-175b",
            "palm", "mt-nlg"} <= set(names)
    for name in names:
        p = load_model_preset(name)
        assert p.sources and all(s.strip() for s in p.sources.values())
        assert p.global_batch >= 1


@pytest.mark.parametrize("name, billions", [("gpt3-175b", 175.0), ("gpt3-13b", 13.0),
                                            ("gpt3-6.7b", 6.7), ("mt-nlg", 530.0),
                                            ("t-nlg", 17.0), ("bert-large", 0.34)])
def test_preset_parameter_counts_match_the_published_sizes(name: str, billions: float) -> None:
    n = load_model_preset(name).config.param_count() / 1e9
    assert abs(n - billions) / billions < 0.03


def test_thesis_table_8_2_hyperparameters() -> None:
    for name, h, layers in (("mega-gpt2", 3072, 74), ("t-nlg", 4256, 78), ("gpt3-175b", 12288, 96),
                            ("palm", 18432, 118), ("mt-nlg", 20480, 105)):
        cfg = load_model_preset(name).config
        assert (cfg.hidden, cfg.layers, cfg.seq_len) == (h, layers, 1024)


@pytest.mark.parametrize("tp, dp, sp", [(2, 2, True), (4, 1, False), (1, 2, False)])
def test_rank_masks_are_slices_of_the_full_global_batch_masks(tp: int, dp: int, sp: bool) -> None:
    cfg = load_model_preset("tiny").config
    ref = Reference(cfg, 9, OptimizerConfig(), 8)
    full_hidden = ref._hidden_mask(2, 1, "mlp_out") * (1 - cfg.hidden_dropout)   # (B, S, H)
    full_probs = ref._probs_mask(2, 0) * (1 - cfg.attention_dropout)              # (B, h, S, S)
    b, s_loc = 8 // dp, cfg.seq_len // tp if sp else cfg.seq_len
    for r_tp in range(tp):
        for r_dp in range(dp):
            d = Dims(cfg.seq_len, b, cfg.hidden, cfg.heads // tp, cfg.head_dim, 0, 0, tp, sp)
            m = Masks(cfg, 9, 2, d, r_dp * b, r_tp, True)
            s0 = r_tp * s_loc if sp else 0
            want = full_hidden[r_dp * b:(r_dp + 1) * b, s0:s0 + s_loc].transpose(1, 0, 2)
            np.testing.assert_array_equal(m.hidden(1, "mlp_out"), want.reshape(-1, cfg.hidden))
            hl = cfg.heads // tp
            np.testing.assert_array_equal(
                m.probs(0), full_probs[r_dp * b:(r_dp + 1) * b, r_tp * hl:(r_tp + 1) * hl])


def test_data_is_deterministic_and_sliceable_by_dp_rank() -> None:
    cfg = load_model_preset("tiny").config
    tok, tgt = seeded.batch(cfg, 1, 4, 8)
    part, _ = seeded.batch(cfg, 1, 4, 8, 2, 6)
    np.testing.assert_array_equal(part, tok[2:6])
    np.testing.assert_array_equal(tok[:, 1:], tgt[:, :-1])
    assert tok.max() < cfg.vocab

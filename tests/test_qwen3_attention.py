"""Qwen3's attention as a model setting (serial): heads of their own width (`kv_channels`,
Megatron-Core's) and QK-norm; the Qwen3 presets' parameter counts against the published
sizes; one-line refusals; every parameter sharded once and back."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from mpiemu.config.errors import ConfigError
from mpiemu.config.train_section import ModelSection
from mpiemu.config.workload import load_workload
from mpiemu.model import seeded
from mpiemu.model.config import FieldError
from mpiemu.model.presets import load_model_preset
from mpiemu.model.tensor_parallel import local_params, shard_params, unshard_params
from mpiemu.runner.train_setup import validate

LLAMA = load_model_preset("tiny-llama").config


@pytest.mark.parametrize("name, total, active, rel_active", [
    # Qwen3 report (arXiv 2505.09388) Table 2 / the model cards: 30.5B total, 3.3B activated;
    # 235B total, 22B activated (two digits: the active counts hold to their rounding)
    ("qwen3-30b-a3b", 30.5, 3.3, 0.02), ("qwen3-235b-a22b", 235.0, 22.0, 0.025)])
def test_qwen3_parameter_counts_match_the_published_sizes(name: str, total: float,
                                                           active: float,
                                                           rel_active: float) -> None:
    cfg = load_model_preset(name).config
    assert (cfg.kv_channels, cfg.head_dim, cfg.qk_norm) == (128, 128, True)
    assert cfg.param_count() / 1e9 == pytest.approx(total, rel=0.005)
    assert cfg.param_count(active=True) / 1e9 == pytest.approx(active, rel=rel_active)


def test_head_dim_is_kv_channels_and_hidden_need_not_divide_by_heads() -> None:
    assert LLAMA.head_dim == 8 and LLAMA.attn_width == LLAMA.hidden
    cfg = dataclasses.replace(LLAMA, hidden=60, kv_channels=16)
    assert (cfg.head_dim, cfg.attn_width) == (16, 128)
    specs = {n: s for n, s, _ in seeded.full_param_specs(dataclasses.replace(cfg, qk_norm=True))}
    assert specs["layers.0.attn.wq"] == (60, 128) and specs["layers.0.attn.wo"] == (128, 60)
    assert specs["layers.0.attn.wk"] == (60, 32) and specs["layers.0.q_norm.g"] == (16,)


@pytest.mark.parametrize("changes, field", [
    (dict(hidden=60), "model.heads"),                      # 60 % 8 without kv_channels
    (dict(kv_channels=-1), "model.kv_channels"),
    (dict(kv_channels=15), "model.kv_channels"),           # odd heads under RoPE
    (dict(qk_norm=True, norm_kind="layernorm"), "model.qk_norm"),
])
def test_bad_head_settings_are_refused_in_one_line(changes: dict[str, object],
                                                   field: str) -> None:
    with pytest.raises(FieldError) as exc:
        dataclasses.replace(LLAMA, **changes)
    assert exc.value.field == field and "\n" not in str(exc.value)


def test_workload_overrides_keep_or_set_the_presets_heads() -> None:
    assert ModelSection(preset="qwen3-30b-a3b").resolve().kv_channels == 128
    cfg = ModelSection(preset="qwen3-30b-a3b", kv_channels=0, qk_norm=False).resolve()
    assert (cfg.head_dim, cfg.qk_norm) == (64, False)
    cfg = ModelSection(preset="tiny-llama", kv_channels=16, qk_norm=True).resolve()
    assert (cfg.head_dim, cfg.qk_norm) == (16, True)
    with pytest.raises(ConfigError):
        ModelSection(preset="tiny-llama", kv_channels=-2)


def test_sunway_ranks_refuse_heads_of_their_own_width() -> None:
    w = load_workload(None, ["run.kind='train'", "device.preset='sw26010pro'",
                             "model.kv_channels=16"])
    with pytest.raises(ConfigError) as exc:
        validate(w, 1)
    assert exc.value.field == "model.kv_channels"


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_qwen3_shards_cover_every_parameter_once_and_round_trip(tp: int) -> None:
    """tp 4 > 2 KV heads: the grouped QKV; the QK-norm gains replicated, partial over TP."""
    cfg = dataclasses.replace(LLAMA, kv_channels=16, qk_norm=True).for_tp(tp)
    full = seeded.init_full_params(cfg, 5)
    back = unshard_params([shard_params(full, cfg, tp, r) for r in range(tp)], cfg)
    assert set(back) == set(full)
    for name in full:
        np.testing.assert_array_equal(back[name], full[name])
    lps = list(local_params(cfg, tp))
    split = sum(lp.size for lp in lps if lp.tp_split)
    assert tp * split + sum(lp.size for lp in lps if not lp.tp_split) == cfg.param_count()
    partial = {lp.name for lp in lps if lp.tp_partial(sp=False, tp=tp)}
    assert partial == ({f"layers.{i}.{x}_norm.g" for i in range(2) for x in "qk"}
                       if tp > 1 else set())

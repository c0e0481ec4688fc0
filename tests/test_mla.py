"""Multi-head latent attention (DeepSeek-V3, arXiv 2412.19437 2.1.1): the preset's sizes,
FLOP and attention-kernel counts, timing independent of the numerics, bad input refused in
one line. Parity with the one-process reference: tests/test_llama_parity.py (`mla-*`)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from mpiemu.analysis import load
from mpiemu.analysis.unfold import timeline_differences
from mpiemu.config.errors import ConfigError
from mpiemu.devices import load_device
from mpiemu.devices.attention_gpu import AttnShape, flash_cost
from mpiemu.model.presets import load_model_preset
from mpiemu.runner.job import validate
from mpiemu.training.flops import latent_weights, layer_forward_flops
from tests.conftest import run_mpi

WORKLOAD = "workloads/quickstart.toml"
MLA = ["model.preset='tiny-llama'", "model.kv_heads=0", "model.q_lora_rank=24",
       "model.kv_lora_rank=16", "model.qk_rope_dim=8", "model.v_head_dim=12",
       "run.kind='train'", "run.iterations=2", "train.global_batch=4", "parallel.dp=1",
       "parallel.tp=1"]


def test_deepseek_v3_has_its_published_parameter_counts() -> None:
    """The report's abstract: 671B parameters in total, 37B activated for each token (the
    main model; the multi-token-prediction module is not in either)."""
    cfg = load_model_preset("deepseek-v3").config
    assert cfg.mla and cfg.qk_head_dim == 192 and cfg.attn_width == 128 * 128
    assert round(cfg.param_count() / 1e9) == 671
    assert 37.0 <= cfg.param_count(active=True) / 1e9 < 38.0


def test_latent_flops_count_every_weight_once_and_the_core_by_head_widths() -> None:
    cfg = load_model_preset("deepseek-v3").config
    norms = cfg.q_lora_rank + cfg.kv_lora_rank
    assert latent_weights(cfg) == cfg.latent_attention_params() - norms
    _, core = layer_forward_flops(cfg, 1)
    assert core == 2.0 * cfg.seq_len * cfg.heads * (192 + 128)


def test_flash_cost_reads_and_multiplies_narrower_value_heads() -> None:
    """Value heads of 128 beside query / key heads of 192: PV and its gradients run 128
    wide; equal widths cost as before (4 d forward, 10 d backward per score)."""
    spec = load_device("h100-sxm5")
    same = AttnShape(128, 4096, 4096, 192, 2, causal=True, training=True)
    narrow = same._replace(v_dim=128)
    pairs = 128 * 4096 * 4096 * 0.5
    assert flash_cost(spec, same, "bf16").flops == 4 * pairs * 192
    assert flash_cost(spec, narrow, "bf16").flops == pairs * (2 * 192 + 2 * 128)
    assert flash_cost(spec, narrow, "bf16", backward=True).flops == pairs * (6 * 192 + 4 * 128)
    assert flash_cost(spec, narrow, "bf16").time_s < flash_cost(spec, same, "bf16").time_s


def test_timing_equals_with_and_without_numerics(tmp_path: Path) -> None:
    """TP 2 with SP: the same emulated timeline whether the math runs or not."""
    runs = []
    for name, numerics in (("on", "on"), ("off", "off")):
        sets = [*MLA, "parallel.tp=2", "parallel.sequence_parallel=true",
                f"run.numerics='{numerics}'", "train.check_reference=false"]
        res = run_mpi(2, ["run", WORKLOAD, *[a for s in sets for a in ("--set", s)],
                          "--out", str(tmp_path / name)])
        assert res.returncode == 0, res.stderr
        runs.append(load(tmp_path / name).ranks)
    assert timeline_differences(*runs) == []
    names = {e for e in load(tmp_path / "off").to_pandas().name}
    assert {"l0.kv_down.fwd", "l0.q_up.fwd.gemm", "l0.k_pe.gather.ag"} <= names


@pytest.mark.parametrize("ranks, extra, field", [
    (2, ["parallel.cp=2", "model.attention='flash'"], "parallel.cp=2: 1 with multi-head"),
    (1, ["fp8.recipe='delayed'", "run.numerics='on'", "run.numeric_dtype='bf16'",
         "device.preset='h100-sxm5'", "run.emulated_dtype='bf16'"],
     "fp8.recipe='delayed': off with multi-head latent attention"),
    (1, ["model.qk_rope_dim=7"], "model.qk_rope_dim=7: must be even and > 0"),
    (1, ["model.kv_heads=2"], "model.kv_heads=2: must be 0 or model.heads"),
    (1, ["model.kv_lora_rank=0"], "model.q_lora_rank=24: needs multi-head latent attention"),
])
def test_bad_latent_settings_are_refused_in_one_line(ranks: int, extra: list[str],
                                                     field: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(field)) as exc:
        validate(WORKLOAD, [*MLA, *extra], ranks)
    assert "\n" not in str(exc.value)



@pytest.mark.parametrize("workload, ranks", [("workloads/qwen3-30b-a3b-ep8.toml", 1),
                                             ("workloads/deepseek-v3-tp2-pp8-ep64.toml", 512)])
def test_the_published_moe_workloads_validate_at_their_sizes(workload: str, ranks: int
                                                             ) -> None:
    """DeepSeek-V3's recipe (512 processes: EP over TP and DP does not fold) with its latent
    attention; Qwen3-30B-A3B's folded onto one process."""
    w = validate(workload, [], ranks)
    assert w.parallel.devices == {1: 8, 512: 512}[ranks]

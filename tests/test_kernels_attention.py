"""Softmax recomposition, flash attention and the kernel options: numerics, costs, config."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mpiemu.analysis import load
from mpiemu.analysis.compare import compare_lines
from mpiemu.devices import attention_gpu as ag
from mpiemu.devices import kernels as hk
from mpiemu.devices.cost import device_cost
from mpiemu.devices.presets import load_device
from mpiemu.model import attention as attn
from mpiemu.model.softmax_recompose import attention_sdf, softmax_sd
from mpiemu.config.workload import load_workload
from mpiemu.config.errors import ConfigError
from tests.conftest import run_mpi

RNG = np.random.default_rng(10)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("t", [1, 4, 5, 16, 40])        # 40 divides L=40; 5 too; 16 does not
def test_ls_ir_gs_equal_softmax_for_t_dividing_and_not(t: int) -> None:
    x = RNG.standard_normal((3, 7, 40)) * 5
    np.testing.assert_allclose(softmax_sd(x, t), _softmax(x), rtol=1e-13, atol=1e-15)


def test_ls_ir_gs_skip_fully_masked_sub_vectors() -> None:
    x = RNG.standard_normal((6, 12))
    x[:, 5:] = -np.inf                                   # causal-like: whole sub-vectors masked
    y = softmax_sd(x, 4)
    assert np.isfinite(y).all() and np.allclose(y[:, 5:], 0.0)
    np.testing.assert_allclose(y[:, :5], _softmax(x[:, :5]), rtol=1e-13)


@pytest.mark.parametrize("variant", ["sd", "sdf"])
@pytest.mark.parametrize("t", [3, 4, 11])                # L = 12: divides, divides, does not
@pytest.mark.parametrize("causal", [True, False])
def test_recomposed_attention_equals_the_baseline_forward_and_backward(
        variant: str, t: int, causal: bool) -> None:
    q, k, v, do = (RNG.standard_normal((2, 3, 12, 4)) for _ in range(4))
    keep = RNG.random((2, 3, 12, 12)) >= 0.25
    o1, c1 = attn.dense(q, k, v, causal, keep, 0.25)
    o2, c2 = attn.dense(q, k, v, causal, keep, 0.25, variant, t)
    np.testing.assert_allclose(o2, o1, rtol=1e-12, atol=1e-14)
    for g1, g2 in zip(attn.dense_back(do, c1, 0.25), attn.dense_back(do, c2, 0.25)):
        np.testing.assert_allclose(g2, g1, rtol=1e-11, atol=1e-13)


def test_sdf_fuses_ls_per_output_tile() -> None:
    q, k, v = (RNG.standard_normal((2, 9, 8)) for _ in range(3))
    o, y = attention_sdf(q, k, v, 0.5, 4, None)
    ref = _softmax((q @ k.swapaxes(-1, -2)) * 0.5)
    np.testing.assert_allclose(y, ref, rtol=1e-13)
    np.testing.assert_allclose(o, ref @ v, rtol=1e-12)


@pytest.mark.parametrize("block", [5, 16])               # 5 does not divide S = 23
@pytest.mark.parametrize("causal", [True, False])
def test_flash_equals_dense_attention_within_1e10_in_float64(block: int, causal: bool) -> None:
    q, k, v, do = (RNG.standard_normal((2, 2, 23, 8)) for _ in range(4))
    keep = RNG.random((2, 2, 23, 23)) >= 0.1
    o1, c1 = attn.dense(q, k, v, causal, keep, 0.1)
    o2, c2 = attn.flash_forward(q, k, v, causal, lambda: keep, 0.1, block)
    assert np.abs(o2 - o1).max() < 1e-10
    for g1, g2 in zip(attn.dense_back(do, c1, 0.1),
                      attn.flash_backward(do, o2, c2, causal, lambda: keep, 0.1, block)):
        assert np.abs(g2 - g1).max() < 1e-10


def _traffic(variant: str, backward: bool = False) -> dict[str, float]:
    m = device_cost(load_device("a100-pcie-40gb"))
    a = ag.AttnShape(16, 4096, 4096, 64, 2)
    return {s.name: ag.step_cost(m, s, "fp16")[2]
            for s in ag.steps(m, a, variant, "fused", "fp16", backward)}


def test_score_matrix_traffic_is_4s_6s_2s_and_none() -> None:
    """Seed 004 2.5: baseline 4 S around the softmax, SD 6 S, SDF 2 S (+ 6 S/T), flash 0."""
    s = 16 * 4096 * 4096 * 2
    base, sd, sdf, flash = (sum(_traffic(v).values()) for v in ("baseline", "sd", "sdf",
                                                                 "flash"))
    assert base == pytest.approx(4 * s, rel=0.02)
    assert sd == pytest.approx(6 * s, rel=0.08)
    assert sdf == pytest.approx(2 * s, rel=0.12) and sdf > 2 * s
    assert flash < 0.1 * s                      # q, k, v, o only


def test_sdf_pays_its_epilogue_on_the_score_gemm() -> None:
    m = device_cost(load_device("a100-pcie-40gb"))
    a = ag.AttnShape(16, 4096, 4096, 64, 2)
    t = {v: {s.name: ag.step_cost(m, s, "fp16")[0] for s in ag.steps(m, a, v, "fused", "fp16")}
         for v in ("baseline", "sdf")}
    assert t["sdf"]["score+ls"] > 1.1 * t["baseline"]["score"]
    assert t["sdf"]["ir"] < 0.05 * t["baseline"]["softmax"]


def test_unfused_softmax_launches_scale_mask_softmax_dropout() -> None:
    tags = [k.tag for k in hk.softmax(1000, 2, "unfused", dropout=True, masked=True)]
    assert tags == ["scale", "mask", "softmax", "dropout"]
    assert [k.tag for k in hk.softmax(1000, 2, "fused", True, True)] == ["softmax", "dropout"]


def test_megatrons_causal_softmax_loads_the_lower_triangle_and_stores_every_score() -> None:
    """scaled_upper_triang_masked_softmax: row r loads r + 1 scores (forward: the scores;
    backward: the gradient and the output), writes all L, in a dense row's time; unfused
    kernels load all."""
    L, s = 8, 2 * 8 * 8 * 2                           # 2 heads of 8 x 8 fp16 scores
    a = ag.AttnShape(2, L, L, 4, 2, causal=True, training=True, triangle=True)
    assert a.loaded == (L + 1) / (2 * L)
    fwd = hk.softmax(a.scores, 2, "fused", False, True, loaded=a.loaded)[0]
    bwd = hk.softmax(a.scores, 2, "fused", False, True, backward=True, loaded=a.loaded)[0]
    assert (fwd.read_bytes, fwd.write_bytes) == (s * 9 / 16, s)
    assert (bwd.read_bytes, bwd.write_bytes) == (2 * s * 9 / 16, s)
    # a warp walks the whole row: a dense row's time (bytes / bandwidth share), fewer bytes
    assert fwd.dram_bytes / fwd.bw_util == pytest.approx(2 * s)
    assert bwd.dram_bytes / bwd.bw_util == pytest.approx(3 * s)
    plain = hk.softmax(a.scores, 2, "unfused", False, True, loaded=a.loaded)
    assert next(k for k in plain if k.tag == "softmax").read_bytes == s
    assert a._replace(triangle=False).loaded == a._replace(causal=False).loaded == 1.0


def _check(*sets: str) -> None:
    load_workload("workloads/quickstart.toml", list(sets))


@pytest.mark.parametrize("key, value, needle", [
    ("model.attention", "'fast'", "model.attention"),
    ("train.kernels", "'partly'", "train.kernels"),
])
def test_bad_kernel_options_are_one_config_error(key: str, value: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle) as err:
        _check(f"{key}={value}")
    assert "\n" not in str(err.value)


def test_compare_shows_the_per_op_differences_of_two_attention_variants(tmp_path: Path
                                                                          ) -> None:
    runs = {}
    for variant in ("baseline", "sdf"):
        out = tmp_path / variant
        res = run_mpi(1, ["run", "workloads/quickstart.toml", "--set", "parallel.dp=1",
                          "--set", "parallel.tp=1", "--set", f"model.attention='{variant}'",
                          "--set", "train.kernels='unfused'", "--set", "run.iterations=1",
                          "--out", str(out)])
        assert res.returncode == 0, res.stderr
        runs[variant] = load(out)
    text = "\n".join(compare_lines(runs["baseline"], runs["sdf"], top=40))
    assert "attn.score+ls" in text and "attn.softmax" in text and "attn.scale" in text


def test_flash_ctas_carry_their_block_pairs_in_launch_order() -> None:
    """FA2's grid: forward, query block m sees key blocks up to the diagonal; backward, key
    block n sees the query blocks from the diagonal down; full attention sees all."""
    a = ag.AttnShape(1, 512, 512, 64, 2, causal=True)
    assert ag._block_pairs(a, 128, 64, backward=False) == (2, 4, 6, 8)
    assert ag._block_pairs(a, 128, 64, backward=True) == (4, 4, 3, 3, 2, 2, 1, 1)
    assert ag._block_pairs(a._replace(causal=False), 128, 64, False) == (8, 8, 8, 8)


def test_flash_list_scheduling_lets_the_heaviest_cta_decide_a_short_run() -> None:
    assert ag._makespan((2, 4, 6, 8), 1, 4) == 8            # one CTA per SM
    assert ag._makespan((2, 4, 6, 8), 1, 2) == 12           # 2 | 4, then 6 -> SM0, 8 -> SM1
    assert ag._makespan((5,), 6, 3) == 10                   # two rounds of three


def test_flash_runs_at_the_mma_sync_rate_where_the_preset_measures_it() -> None:
    import dataclasses
    h100 = load_device("h100-sxm5")
    a = ag.AttnShape(96, 2048, 2048, 128, 2, training=True)
    wgmma = dataclasses.replace(h100, kernels=dataclasses.replace(
        h100.kernels, mma_sync_efficiency=0.0))             # 0: the GEMMs' efficiency
    assert h100.kernels.mma_sync_efficiency < h100.gemm.efficiency
    assert ag.flash_cost(h100, a, "fp16").time_s > ag.flash_cost(wgmma, a, "fp16").time_s


def test_flash_backward_pays_its_dq_atomics_where_the_preset_measures_them() -> None:
    import dataclasses
    h100 = load_device("h100-sxm5")
    free = dataclasses.replace(h100, kernels=dataclasses.replace(
        h100.kernels, l2_atomic_bytes_per_s=0.0))              # 0: not charged
    a = ag.AttnShape(96, 2048, 2048, 128, 2, training=True)
    assert ag.flash_cost(h100, a, "fp16", True).time_s > ag.flash_cost(free, a, "fp16", True).time_s
    assert ag.flash_cost(h100, a, "fp16").time_s == ag.flash_cost(free, a, "fp16").time_s

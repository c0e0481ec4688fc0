"""Number formats, FP8 scaling recipes, FP16 loss scaling and GEMMs in a precision, against
hand-made cases worked out from Transformer Engine's and Megatron's rules."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mpiemu.precision.formats import amax, round_to
from mpiemu.precision.loss_scale import DynamicLossScaler
from mpiemu.precision.fp8_gemm import Fp8Gemm, Fp8Recipe
from mpiemu.precision.matmul import PrecisionGemm
from mpiemu.precision.scaling import DelayedScaling, block_quantize, current_scale, expand, \
    pow2_floor, tensor_quantize


@pytest.mark.parametrize("fmt, x, want", [
    ("e4m3", 449.0, 448.0), ("e4m3", 464.0, 448.0), ("e4m3", 470.0, 448.0),   # satfinite
    ("e4m3", 1e4, 448.0), ("e4m3", -1e4, -448.0), ("e4m3", 2.0 ** -10, 0.0),
    ("e4m3", 1.5 * 2.0 ** -10, 2.0 ** -9), ("e4m3", 1.0625, 1.0), ("e4m3", 1.1875, 1.25),
    ("e5m2", 61439.0, 57344.0), ("e5m2", 61440.0, 57344.0), ("e5m2", 1.125, 1.0),
    ("bf16", 1 + 2.0 ** -8, 1.0), ("bf16", 1 + 3 * 2.0 ** -8, 1.015625),
    ("fp16", 70000.0, np.inf), ("fp16", 1 + 2.0 ** -11, 1.0),
])
def test_a_format_rounds_to_nearest_even_and_fp8_saturates(fmt: str, x: float,
                                                           want: float) -> None:
    assert round_to(np.array([x]), fmt)[0] == want


def test_delayed_scaling_follows_te_history_and_margin() -> None:
    """TE's DelayedScaling, history 3, margin 1, by hand: slot 0 stages the step's amax, the
    update takes the max over the window (this step and the two before) or slot 0 alone,
    scale = 448 / amax / 2; an amax of 0 or inf keeps the scale; casts use the scale of the
    previous update (1 at first)."""
    amaxes = [2.0, 8.0, 4.0, 1.0, 0.5, 0.0, np.inf]
    want = {"max": [112, 28, 28, 28, 56, 224, 224],
            "most_recent": [112, 28, 56, 224, 448, 448, 448]}
    for algo, scales in want.items():
        st = DelayedScaling(448.0, history_len=3, margin=1, algo=algo)
        used, got = [], []
        for a in amaxes:
            used.append(st.scale)
            st.record(a)
            st.update()
            got.append(st.scale)
        assert got == scales, algo
        assert used == [1.0, *scales[:-1]]
    st = DelayedScaling(448.0, history_len=4)
    for a in (3.0, 5.0):
        st.record(a)
        st.update()
    assert st.history.tolist() == [0.0, 0.0, 3.0, 5.0]     # rolled, slot 0 cleared


def test_current_and_block_scales() -> None:
    assert current_scale(4.0, 448.0) == 112.0 and current_scale(0.0, 448.0) == 1.0
    assert current_scale(3.0, 448.0, power_of_2=True) == 128.0
    assert current_scale(1e-12, 448.0, epsilon=1e-3) == pytest.approx(448e3, rel=1e-6)
    assert float(pow2_floor(448.0 / 3.0)) == 128.0
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 300)).astype(np.float32) * np.array([1, 1e3, 1e-3])[:, None]
    x[2, 128:256] = 0.0
    q, s = block_quantize(x, (1, 128), "e4m3", 448.0)
    assert s.shape == (3, 3) and s[2, 1] == 1.0 and np.all(q[2, 128:256] == 0)
    for r in range(3):
        for t in range(3):
            tile = q[r, t * 128:(t + 1) * 128]
            if np.any(tile):      # a power-of-2 scale lands the tile's amax in (224, 448]
                assert 224.0 < np.abs(tile).max() <= 448.0


def test_fp16_loss_scaling_skips_overflowing_steps_then_trains() -> None:
    """Least squares with fp16 gradients and Megatron's scaler from 2**32: the scaled
    gradients overflow, steps are skipped while the scale backs off (after `hysteresis`
    overflows, then at every one), and once they fit every step runs and the loss falls."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 8)).astype(np.float32)
    y = x @ rng.standard_normal(8).astype(np.float32)
    w = np.zeros(8, dtype=np.float32)                      # fp32 master weights
    scaler = DynamicLossScaler(growth_interval=4)
    ran, scales, losses = [], [], []
    for _ in range(60):
        w16 = round_to(w, "fp16")
        r = round_to(x @ w16 - y, "fp16")
        losses.append(float(np.mean(r.astype(np.float64) ** 2)))
        with np.errstate(over="ignore", invalid="ignore"):      # the overflow looked for
            grad16 = round_to(round_to(x.T, "fp16") @ round_to(r * scaler.scale, "fp16")
                              * (2.0 / len(y)), "fp16")    # backward of the scaled loss
        found_inf = not np.all(np.isfinite(grad16))
        scales.append(scaler.scale)
        ok = scaler.update(found_inf)
        ran.append(ok)
        if ok:
            w = w - 0.05 * grad16.astype(np.float32) / np.float32(scales[-1])
    first = ran.index(True)
    assert first > 2 and not any(ran[:first])
    assert scales[1] == scales[0] and scales[2] == scales[1] / 2       # hysteresis 2
    assert max(scales[first:]) > scales[first]                          # grew back
    assert losses[-1] < 0.01 * losses[first]


def test_loss_scale_grows_after_an_interval_and_not_below_its_floor() -> None:
    s = DynamicLossScaler(scale=4.0, min_scale=2.0, growth_interval=3, hysteresis=1)
    assert [s.update(False) for _ in range(3)] == [True] * 3 and s.scale == 8.0
    for _ in range(5):
        assert not s.update(True)
    assert s.scale == 2.0


def _operands() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(2)
    a = rng.standard_normal((96, 512)).astype(np.float32)
    b = rng.standard_normal((512, 64)).astype(np.float32) * 0.02
    return a, b, a.astype(np.float64) @ b


def _rel(out: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(out - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize("compute, bound", [("bf16", 2 ** -7), ("fp16", 2 ** -10)])
def test_a_half_precision_gemm_accumulates_in_fp32_and_rounds_once(compute: str,
                                                                   bound: float) -> None:
    a, b, ref = _operands()
    out = PrecisionGemm(compute)("g", a, b, ("act", "weight"))
    want = round_to(round_to(a, compute) @ round_to(b, compute), compute)
    assert np.array_equal(out, want) and _rel(out, ref) < bound
    g = PrecisionGemm(compute)
    acc = g.accumulate("g", a, b)         # a weight gradient into fp32 main_grad: unrounded
    assert np.array_equal(acc, round_to(a, compute) @ round_to(b, compute))
    assert np.array_equal(g.round(acc), want) and not np.array_equal(acc, want)
    exact = PrecisionGemm("fp32")
    assert exact.exact and exact("g", a, b).dtype == np.float32 and exact.round(a) is a


def test_fp8_recipes_errors_and_why_blocks_exist() -> None:
    """Each recipe's GEMM is within FP8's error of the float64 product. With a few outlier
    channels (LLM activations), one scale per tensor pushes the ordinary values toward
    E4M3's subnormals; 1 x 128 tiles keep each tile's own range (DeepSeek-V3 §3.3.1), so
    the tiles without outliers keep E4M3's full precision."""
    a, b, ref = _operands()
    for kind in ("current", "delayed", "block"):
        g = Fp8Gemm(Fp8Recipe(kind))
        assert _rel(g("g", a, b, ("act", "weight")), ref) < 0.08, kind
    a[:, :3] *= 1e4
    s = current_scale(amax(a), 448.0)
    per_tensor = tensor_quantize(a, s, "e4m3") / s
    q, sb = block_quantize(a, (1, 128), "e4m3", 448.0)
    per_tile = q / expand(sb, (1, 128), a.shape)
    rest = np.s_[:, 128:]
    err_tensor = np.abs(per_tensor - a)[rest].mean() / np.abs(a[rest]).mean()
    err_tile = np.abs(per_tile - a)[rest].mean() / np.abs(a[rest]).mean()
    assert err_tile < 0.03 and err_tensor > 1.5 * err_tile


def test_delayed_gemm_casts_with_the_previous_steps_amax() -> None:
    """Step 1 casts with scale 1 (nothing recorded); after the pass the scales come from
    step 1's amaxes: an input 1000x larger at step 2 overflows E4M3 and saturates."""
    a, b, _ = _operands()
    g = Fp8Gemm(Fp8Recipe("delayed", amax_history_len=1))
    g("g", a, b, ("act", "weight"))
    g.end_pass(backward=False)
    st = g.states[("g", "act")]
    assert st.scale == pytest.approx(448.0 / np.abs(a).max(), rel=1e-6)
    big = a * 1e3
    g.new_step()
    out = g("g", big, b, ("act", "weight"))
    assert _rel(out, big.astype(np.float64) @ b) > 0.5       # clipped at 448 / scale
    g.end_pass(backward=False)
    g.new_step()
    assert _rel(g("g", big, b, ("act", "weight")), big.astype(np.float64) @ b) < 0.08


def test_fp8_backward_reuses_the_forward_casts() -> None:
    """The wgrad casts its input with the scale of that input's forward pass (first in,
    first out over micro-batches), the dgrad the weight with this step's FP8 copy's scale
    (cast at the first micro-batch only); a pass's amaxes go through the group's MAX
    reduction before the delayed scales update."""
    a, b, _ = _operands()
    seen: list[np.ndarray] = []

    def reduce(x: np.ndarray) -> np.ndarray:
        seen.append(x.copy())
        return x * 2.0                        # as if another rank held twice the amaxes
    g = Fp8Gemm(Fp8Recipe("delayed", amax_history_len=1), reduce)
    g("g", a, b, ("act", "weight"))                             # micro-batch 0, scale 1
    g.end_pass(backward=False)
    # the weight is cast from its bf16 copy (the fp32 master only under FP8 parameters)
    assert np.array_equal(seen[0], [np.abs(a).max(), np.abs(round_to(b, "bf16")).max()])
    s_act = g.states[("g", "act")].scale
    assert s_act == pytest.approx(448.0 / (2 * np.abs(a).max()), rel=1e-6)
    g("g", a * 4, b, ("act", "weight"))                         # micro-batch 1
    g.end_pass(backward=False)
    assert seen[1][1] == 0.0                 # the cached FP8 weight was not cast again
    assert list(g.saved["g"]) == [1.0, s_act]
    dy = a[:, :64] * 1e-3                                       # (M, N): a gradient
    dw = g.accumulate("g", a.T, dy, ("act", "grad"))          # micro-batch 0's wgrad
    want = tensor_quantize(a.T, 1.0, "e4m3") @ tensor_quantize(dy, 1.0, "e5m2")
    assert np.array_equal(dw, want)           # its input at its forward's scale (1)
    g.end_pass(backward=True)                 # micro-batch 0's backward releases its input
    assert list(g.saved["g"]) == [s_act]
    g.new_step()
    assert not g.weight_scale


def test_hybrid_casts_gradients_to_e5m2_and_block_keeps_e4m3() -> None:
    assert Fp8Recipe("delayed").fmt_of("grad") == "e5m2"
    assert Fp8Recipe("delayed", fp8_format="e4m3").fmt_of("grad") == "e4m3"
    assert Fp8Recipe("block").fmt_of("grad") == "e4m3"
    assert Fp8Recipe("current").fmt_of("act") == "e4m3"


@pytest.mark.parametrize("variant", ["baseline", "sdf", "flash"])
def test_fp32_attention_stays_fp32_with_dropout(variant: str) -> None:
    """A numpy float64 scalar (np.sqrt of an int) or a bool mask times a Python float would
    promote the core to float64: an fp32 run must compute, and send, fp32."""
    from mpiemu.model import attention as attn
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 16, 8)).astype(np.float32) for _ in range(3))
    keep = rng.random((1, 2, 16, 16)) > 0.1
    o, cache = attn.forward(variant, q, k, v, True, lambda: keep, 0.1, 8)
    assert o.dtype == np.float32
    do = np.ones_like(o)
    grads = attn.dense_back(do, cache, 0.1) if variant != "flash" else \
        attn.flash_backward(do, o, cache, True, lambda: keep, 0.1, 8)
    assert all(g.dtype == np.float32 for g in grads)


def test_fp32_pipeline_run_passes_its_reference_check(tmp_path: Path) -> None:
    from tests.conftest import run_mpi
    res = run_mpi(2, ["run", "workloads/quickstart.toml", "--set", "parallel.tp=1", "--set",
                      "parallel.pp=2", "--set", "parallel.dp=1", "--set", "run.iterations=2",
                      "--set", "run.numeric_dtype='fp32'", "--out", str(tmp_path)])
    assert res.returncode == 0, res.stderr[-800:]
    assert "reference check" in res.stdout and "PASS" in res.stdout

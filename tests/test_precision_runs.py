"""Training runs in a precision below fp64: the sharded run against the one-process reference
in the same precision (iteration 0's gradients and the losses judged), and its drift from a
float64 reference in the summary and in `mpiemu analyze`."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mpiemu.analysis import load
from mpiemu.analysis.summary import format_tables
from tests.conftest import our_lines, run_mpi


def _run(tmp: Path, tp: int, pp: int, dp: int, dtype: str, *extra: str) -> dict[str, Any]:
    res = run_mpi(tp * pp * dp, ["run", "workloads/quickstart.toml", "--set", f"parallel.tp={tp}",
                                 "--set", f"parallel.pp={pp}", "--set", f"parallel.dp={dp}",
                                 "--set", "run.iterations=3", "--set",
                                 f"run.numeric_dtype='{dtype}'", *extra, "--out", str(tmp)],
                  timeout=240)
    assert res.returncode == 0, res.stdout[-1500:] + res.stderr[-1500:]
    summary: dict[str, Any] = json.loads((tmp / "manifest.json").read_text())["summary"]
    return summary


@pytest.mark.parametrize("tp, pp, dp", [(2, 1, 1), (1, 2, 1), (2, 2, 2)])
def test_bf16_run_matches_the_bf16_reference_and_reports_its_drift(tp: int, pp: int, dp: int,
                                                                    tmp_path: Path) -> None:
    """Iteration 0's gradients within 2**-5 of the bf16 reference's, tensor by tensor, and
    the losses too; the drift from float64 is reported for every iteration. Without TP the
    median tensor is much closer to the bf16 reference than to exact arithmetic: the run
    rounds where the reference rounds (were its GEMMs exact, the two medians would be
    alike). With TP each rank's partial sum is a bf16 tensor before the reduction, as NCCL
    reduces bf16 (the reference, unsharded, never forms it), which moves the run as far
    from the bf16 reference as bf16 is from exact."""
    s = _run(tmp_path, tp, pp, dp, "bf16")
    ref, drift = s["reference"], s["drift"]
    assert ref["passed"] and ref["tolerance"] == 2.0 ** -5
    assert ref["grad_rel_err"] <= 2.0 ** -5 and ref["loss_rel_err"] <= 2.0 ** -5
    if tp == 1:
        assert ref["grad_median_rel_err"] < 0.5 * drift["first_grads"]["median"]
    assert [r["iteration"] for r in drift["iterations"]] == [0, 1, 2]
    assert all(0 < r["loss_rel_diff"] < 1e-3 for r in drift["iterations"])
    # bf16's own effect on the first gradients: rounding-sized, far above fp32's
    assert 2.0 ** -12 < drift["first_grads"]["median"] < 2.0 ** -6


def test_fp32_run_is_judged_on_its_gradients_to_fp32_rounding(tmp_path: Path) -> None:
    s = _run(tmp_path, 2, 1, 1, "fp32", "--set", "optimizer.zero=0")
    ref, drift = s["reference"], s["drift"]
    assert ref["passed"] and ref["grad_rel_err"] < 2.0 ** -17 and ref["loss_rel_err"] < 1e-6
    assert drift["first_grads"]["max"] < 1e-5
    lines = format_tables(load(tmp_path))
    assert any(ln.startswith("precision: fp32 numerics against a float64 reference")
               for ln in lines)


@pytest.mark.parametrize("zero", [1, 3])
def test_gradients_sharded_by_zero_are_gathered_for_the_check(zero: int, tmp_path: Path
                                                              ) -> None:
    """Under ZeRO the reduced gradients live in each DP rank's share of the buckets: the
    check gathers them (an empty or unreduced gradient would fail it)."""
    s = _run(tmp_path, 1, 1, 2, "fp32", "--set", f"optimizer.zero={zero}")
    assert s["reference"]["passed"] and s["reference"]["worst_grad"] != "-"
    assert s["drift"]["iterations"][-1]["param_rel_err_max"] is not None


@pytest.mark.parametrize("extra, needle", [
    (["--set", "overlap.strategy='t3-mca'", "--set", "device.preset='t3-gpu'"],
     "overlap.strategy='t3-mca'"),
    (["--set", "model.preset='tiny-moe'", "--set", "parallel.ep=2",
      "--set", "optimizer.zero=0"], "with experts"),
])
def test_bf16_refused_where_its_rounding_is_not_modelled(extra: list[str], needle: str,
                                                         tmp_path: Path) -> None:
    res = run_mpi(2, ["run", "workloads/quickstart.toml", "--set", "run.numeric_dtype='bf16'",
                      "--set", "parallel.tp=2", "--set", "parallel.dp=1", *extra,
                      "--out", str(tmp_path)])
    lines = our_lines(res.stderr)
    assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr
    assert "run.numeric_dtype" in lines[0] and needle in lines[0], lines


def test_bf16_numerics_only_for_training(tmp_path: Path) -> None:
    res = run_mpi(2, ["run", "workloads/collectives.toml", "--set", "run.numeric_dtype='bf16'",
                      "--set", "parallel.tp=2", "--out", str(tmp_path)])
    lines = our_lines(res.stderr)
    assert res.returncode == 2 and "run.numeric_dtype" in lines[0] and "run.kind" in lines[0]


FP16 = ["--set", "run.iterations=8", "--set", "optimizer.initial_loss_scale=16777216",
        "--set", "optimizer.hysteresis=1"]


def test_fp16_skips_overflowing_steps_then_trains_as_its_reference(tmp_path: Path) -> None:
    """From a loss scale of 2**24 the scaled gradients overflow fp16: those steps are
    skipped (the weights stay, the loss scale halves at each with hysteresis 1) until the
    scale fits, then every step runs and the loss falls; the fp16 reference skips the same
    steps (the losses agree) and the first step taken has the reference's gradients."""
    s = _run(tmp_path, 2, 1, 1, "fp16", *FP16)
    rows = s["iterations"]
    skipped = [r["skipped"] for r in rows]
    first = skipped.index(False)
    assert first >= 1 and all(skipped[:first])
    scales = [r["loss_scale"] for r in rows]
    assert scales[:first + 1] == [2.0 ** 24 / 2 ** k for k in range(first + 1)]
    taken = [r["loss"] for r, skip in zip(rows, skipped) if not skip]
    assert len(taken) >= 3 and taken[-1] < taken[0]
    ref = s["reference"]
    assert ref["passed"] and ref["grad_iteration"] == first and ref["loss_rel_err"] < 1e-3


def test_fp16_emulated_times_do_not_depend_on_skipped_steps(tmp_path: Path) -> None:
    """A skipped step is charged as a taken one: the same run timing only (no values, so
    nothing overflows) has bit-identical emulated times."""
    import numpy as np
    on, off = tmp_path / "on", tmp_path / "off"
    s = _run(on, 2, 1, 1, "fp16", *FP16, "--set", "train.check_reference=false")
    assert any(r["skipped"] for r in s["iterations"])
    _run(off, 2, 1, 1, "fp16", *FP16, "--set", "run.numerics='off'",
         "--set", "train.check_reference=false")
    for a, b in zip(load(on).ranks, load(off).ranks):
        assert np.array_equal(a.events["t_start"], b.events["t_start"])
        assert np.array_equal(a.events["t_end"], b.events["t_end"])


@pytest.mark.parametrize("sets, needle", [
    (["--set", "optimizer.zero=1", "--set", "parallel.dp=2", "--set", "parallel.tp=1"],
     "optimizer.zero=1"),
    (["--set", "optimizer.loss_scale=-1"], "optimizer.loss_scale"),
    (["--set", "optimizer.hysteresis=0"], "optimizer.hysteresis"),
])
def test_fp16_bad_input_is_one_line(sets: list[str], needle: str, tmp_path: Path) -> None:
    res = run_mpi(2, ["run", "workloads/quickstart.toml", "--set", "run.numeric_dtype='fp16'",
                      "--set", "parallel.tp=2", "--set", "parallel.dp=1", *sets,
                      "--out", str(tmp_path)])
    lines = our_lines(res.stderr)
    assert res.returncode == 2 and len(lines) == 1 and needle in lines[0], lines

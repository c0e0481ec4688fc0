"""The `sublayers` workload kind and the t3 report: validation, runs, tables."""
from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest
from mpi4py import MPI

from mpiemu.config.workload import load_workload
from mpiemu.config.errors import ConfigError
from mpiemu.studies import t3 as report
from mpiemu.runner.job import run_workload
from mpiemu.runner.sublayers import validate
from tests.conftest import child_env

WORKLOAD = str(Path(__file__).resolve().parents[1] / "workloads" / "t3_sublayers.toml")
TINY = ['sublayers.models=[{name="tiny", hidden=120, tokens=37}]', "run.numerics='on'",
        "run.numeric_dtype='fp64'", 'sublayers.sublayers=["OP-fwd", "FC-2-fwd"]']


def check(*overrides: str, world: int = 8) -> None:
    w = load_workload(WORKLOAD, [f"parallel.tp={world}", *overrides])
    validate(w, world)


def test_the_shipped_workload_validates_at_tp_8_and_16() -> None:
    check(world=8)
    check(world=16)


@pytest.mark.parametrize("override, needle", [
    ('sublayers.sublayers=["QKV-fwd"]', "sublayers.sublayers[0]"),
    ('sublayers.strategies=["t3"]', "must include 'sequential'"),
    ("device.preset='sw26010pro'", "model a GPU memory system"),
    ('sublayers.models=[{name="odd", hidden=30, tokens=8}]', "divisible by parallel.tp=8"),
    ("sublayers.mode='broadcast'", "sublayers.mode"),
])
def test_bad_input_is_one_config_error(override: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        check(override)


def test_a_gpu_preset_without_overlap_parameters_is_refused(tmp_path: Path) -> None:
    text = (Path(__file__).parents[1] / "mpiemu/devices/presets/h100-sxm5.toml").read_text()
    bare = tmp_path / "bare-gpu.toml"
    bare.write_text(text.split("[t3]")[0])
    with pytest.raises(ConfigError, match="overlap-model parameters"):
        check(f"device.preset='{bare}'")


def rows(path: Path) -> list[dict[str, str]]:
    with (path / "sublayers.csv").open() as f:
        return list(csv.DictReader(f))


@pytest.mark.mpi(min_size=2)
def test_every_strategy_computes_the_sequential_result(mpi_tmp_path: Path) -> None:
    n = MPI.COMM_WORLD.size
    run_workload(WORKLOAD, [f"parallel.tp={n}", *TINY], str(mpi_tmp_path), [],
                 world=MPI.COMM_WORLD)
    MPI.COMM_WORLD.Barrier()
    got = rows(mpi_tmp_path)
    assert {r["strategy"] for r in got} == {"sequential", "ideal", "ideal+nmc", "t3",
                                            "t3-mca", "sw-overlap(16)", "sw-overlap(8)"}
    assert all(float(r["max_abs_diff"]) < 1e-9 for r in got)
    assert all(float(r["speedup"]) >= 1 - 1e-12 for r in got if r["strategy"] == "ideal")


@pytest.mark.mpi(min_size=2)
def test_sweeps_are_deterministic(mpi_tmp_path: Path) -> None:
    n = MPI.COMM_WORLD.size
    times = []
    for i in range(2):
        out = mpi_tmp_path / f"r{i}"
        run_workload(WORKLOAD, [f"parallel.tp={n}", *TINY[:1], "run.numerics='off'"],
                     str(out), [], world=MPI.COMM_WORLD)
        MPI.COMM_WORLD.Barrier()
        times.append([r["time_s"] for r in rows(out)])
    assert times[0] == times[1]


def synthetic() -> list[dict[str, float | str | int]]:
    out: list[dict[str, float | str | int]] = []
    for model, tp, sub, sp in (("a", 8, "OP-fwd", 1.5), ("b", 16, "FC-2-fwd", 1.2)):
        for s, f in (("sequential", 1.0), ("ideal", sp), ("ideal+nmc", sp), ("t3", 1.1),
                     ("t3-mca", sp - 0.05)):
            out.append({"model": model, "tp": tp, "sublayer": sub, "strategy": s,
                        "speedup": f, "dram_total": 100.0 / f})
    return out


def test_report_geomeans_are_over_all_sub_layers() -> None:
    summ = report.summarize(synthetic())
    assert summ["ideal"]["geomean"] == pytest.approx((1.5 * 1.2) ** 0.5 - 1)
    assert summ["ideal"]["max"] == pytest.approx(0.5)
    assert summ["t3"]["dram_mean"] == pytest.approx(1 / 1.1 - 1)


def test_report_checks_the_thesis_tolerance_and_ordering() -> None:
    lines = report.acceptance(report.summarize(synthetic()))
    assert any(line.startswith("- t3: geomean 10.0%") and "OUTSIDE" in line for line in lines)
    assert lines[-1].endswith("holds")


def test_report_command_writes_tables_and_charts(tmp_path: Path) -> None:
    """`mpiemu report t3` end to end, on two ranks and one sub-layer to stay quick."""
    res = run_mpi_free(["report", "t3", "--tp", "2", "--out", str(tmp_path), "--set",
                        'sublayers.sublayers=["OP-fwd"]'])
    assert res.returncode == 0, res.stderr
    for name in ("README.md", "sublayers.csv", "summary.csv", "speedup.png", "dram.png"):
        assert (tmp_path / name).stat().st_size > 0
    text = (tmp_path / "README.md").read_text()
    assert "ours beside the thesis" in text and "| t3-mca |" in text


def run_mpi_free(args: list[str]) -> subprocess.CompletedProcess[str]:
    """`python -m mpiemu ARGS` as a plain process (the report launches its own mpiexec)."""
    return subprocess.run([sys.executable, "-m", "mpiemu", *args], capture_output=True,
                          text=True, timeout=300, env=child_env())

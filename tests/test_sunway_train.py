"""Sunway ranks in training: SwFormer CG schedules charged per layer, numerics untouched."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mpiemu.analysis import load
from tests.conftest import our_lines, run_mpi

TINY = ["--set", "device.preset=sw26010pro", "--set", "run.emulated_dtype=fp32",
        "--set", "parallel.tp=2", "--set", "parallel.dp=1", "--set", "run.iterations=2"]


def _times(run_dir: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(r.events["t_start"], r.events["t_end"]) for r in load(run_dir).ranks]


@pytest.mark.parametrize("scheduler", ["intra", "ka"])
def test_sunway_ranks_train_correctly_and_time_the_same_without_numerics(
        tmp_path: Path, scheduler: str) -> None:
    on = run_mpi(2, ["run", "workloads/quickstart.toml", *TINY, "--set",
                     f"sunway.scheduler={scheduler}", "--out", str(tmp_path / "on")])
    assert on.returncode == 0, on.stderr
    assert "PASS" in on.stdout                      # reference check of the parameters
    off = run_mpi(2, ["run", "workloads/quickstart.toml", *TINY, "--set",
                      f"sunway.scheduler={scheduler}", "--set", "run.numerics=off", "--set",
                      "train.check_reference=false", "--out", str(tmp_path / "off")])
    assert off.returncode == 0, off.stderr
    for (s0, e0), (s1, e1) in zip(_times(tmp_path / "on"), _times(tmp_path / "off")):
        assert np.array_equal(s0, s1) and np.array_equal(e0, e1)


def test_layer_ops_run_on_named_core_groups(tmp_path: Path) -> None:
    res = run_mpi(2, ["run", "workloads/quickstart.toml", *TINY, "--set",
                      "run.numerics=off", "--set", "train.check_reference=false",
                      "--out", str(tmp_path)])
    assert res.returncode == 0, res.stderr
    rt = load(tmp_path).ranks[0]
    cg_events = {str(r) for r in rt.resources if str(r).startswith("cg")}
    assert cg_events >= {f"cg{i}" for i in range(6)}
    spans = [n for n in rt.names if str(n).endswith(".attn.cgs")]
    assert spans, "each op's span names the CGs it ran on"


def test_gpt3_6_7b_sunway_tp8_runs_timing_only_and_opens_in_analysis(tmp_path: Path) -> None:
    res = run_mpi(8, ["run", "workloads/gpt3-6.7b-sunway-tp8.toml", "--out", str(tmp_path)],
                  timeout=300)
    assert res.returncode == 0, res.stderr
    run = load(tmp_path)
    assert run.complete and len(run.ranks) == 8
    assert any(str(n).endswith("attn.b.cgs") for n in run.ranks[0].names)


@pytest.mark.parametrize("override, needle", [
    ("parallel.sequence_parallel=true", "parallel.sequence_parallel=True"),
    ("overlap.strategy=t3", "overlap.strategy='t3'"),
    ("sunway.mode=single-cg", "sunway.mode='single-cg'"),
])
def test_unsupported_sunway_settings_are_refused_in_one_line(tmp_path: Path, override: str,
                                                             needle: str) -> None:
    res = run_mpi(2, ["run", "workloads/quickstart.toml", *TINY, "--set", override,
                      "--out", str(tmp_path)])
    assert res.returncode == 2
    lines = our_lines(res.stderr)
    assert len(lines) == 1 and needle in lines[0], res.stderr

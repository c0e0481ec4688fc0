"""A training run under a fused overlap strategy reports its speedup over `sequential`."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_mpi


def test_tiny_run_with_t3_mca_matches_reference_and_reports_speedup(tmp_path: Path) -> None:
    res = run_mpi(2, ["run", "workloads/quickstart.toml", "--set", "parallel.dp=1",
                      "--set", "overlap.strategy=t3-mca", "--out", str(tmp_path)])
    assert res.returncode == 0, res.stderr
    assert "PASS" in res.stdout and "sequential" in res.stdout
    ov = json.loads((tmp_path / "manifest.json").read_text())["summary"]["overlap"]
    assert ov["speedup"] == pytest.approx(ov["sequential_s"] / ov["iteration_s"])


def test_mega_gpt2_tp8_t3_mca_speedup_is_in_the_thesis_range(tmp_path: Path) -> None:
    """Thesis 8.5.3: T3-MCA speeds training up by 7 to 12%."""
    res = run_mpi(8, ["run", "workloads/mega-gpt2-tp8-t3.toml", "--out", str(tmp_path)],
                  timeout=300)
    assert res.returncode == 0, res.stderr
    ov = json.loads((tmp_path / "manifest.json").read_text())["summary"]["overlap"]
    assert 1.07 <= ov["speedup"] <= 1.12

"""Sharded training equals the one-process reference: every rank's shards, every loss.

For (tp, dp) in {(1,1), (2,1), (1,2), (2,2), (4,1), (4,2)}, with and without sequence
parallelism, dropout on and off: after 3 float64 training steps every rank's parameter shards
and the losses agree with the unsharded reference to <= 1e-10 relative error. Grids whose
size equals the MPI world run in-process (`make test` runs 1, 2 and 4 ranks); the 8-rank grid
runs as its own `mpiexec -n 8` job.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mpi4py import MPI

from mpiemu.runner.job import run_workload
from tests.conftest import run_mpi

MATRIX = [(1, 1), (2, 1), (1, 2), (2, 2), (4, 1), (4, 2)]
TOLERANCE = 1e-10


def overrides(tp: int, dp: int, sp: bool, dropout: bool, *extra: str) -> list[str]:
    rate = 0.1 if dropout else 0.0
    return ["run.kind='train'", "run.iterations=3", "run.numerics='on'",
            "run.numeric_dtype='fp64'", f"parallel.tp={tp}", f"parallel.dp={dp}",
            f"parallel.sequence_parallel={str(sp).lower()}", "model.preset='tiny'",
            f"model.hidden_dropout={rate}", f"model.attention_dropout={rate}",
            "train.check_reference=true", "train.dp_bucket_MiB=0.02", *extra]


def assert_matches_reference(summary: dict[str, Any]) -> None:
    ref = summary["reference"]
    assert ref["param_rel_err"] <= TOLERANCE, ref
    assert ref["loss_rel_err"] <= TOLERANCE, ref
    assert ref["passed"]


def grids_of_this_world() -> list[tuple[int, int]]:
    return [(tp, dp) for tp, dp in MATRIX if tp * dp == MPI.COMM_WORLD.Get_size()]


@pytest.mark.mpi
@pytest.mark.parametrize("sp", [False, True], ids=["tp", "sp"])
@pytest.mark.parametrize("dropout", [False, True], ids=["nodrop", "drop"])
def test_every_rank_matches_the_reference_after_three_steps(mpi_tmp_path: Path, sp: bool,
                                                            dropout: bool) -> None:
    grids = grids_of_this_world()
    if not grids:
        pytest.skip("no grid of the matrix has this many ranks")
    for tp, dp in grids:
        out = mpi_tmp_path / f"{tp}x{dp}"
        assert_matches_reference(run_workload(None, overrides(tp, dp, sp, dropout), str(out),
                                              [], world=MPI.COMM_WORLD))


@pytest.mark.mpi
@pytest.mark.parametrize("variant", [
    ["model.attention='flash'"],
    ["optimizer.name='lamb'"],
    ["model.norm='post'", "model.attention_mask='bidirectional'"],
], ids=["flash", "lamb", "bert"])
def test_variants_match_the_reference_on_the_largest_grid(mpi_tmp_path: Path,
                                                          variant: list[str]) -> None:
    grids = grids_of_this_world()
    if not grids:
        pytest.skip("no grid of the matrix has this many ranks")
    tp, dp = max(grids)
    out = mpi_tmp_path / "variant"
    assert_matches_reference(run_workload(None, overrides(tp, dp, tp > 1, True, *variant),
                                          str(out), [], world=MPI.COMM_WORLD))


@pytest.mark.parametrize("sp", [False, True], ids=["tp", "sp"])
@pytest.mark.parametrize("dropout", [False, True], ids=["nodrop", "drop"])
def test_eight_ranks_tp4_dp2_match_the_reference(tmp_path: Path, sp: bool,
                                                 dropout: bool) -> None:
    sets = [a for o in overrides(4, 2, sp, dropout) for a in ("--set", o)]
    workload = tmp_path / "parity.toml"
    workload.write_text('name = "parity"\n')
    res = run_mpi(8, ["run", str(workload), *sets, "--out", str(tmp_path / "run")],
                  timeout=240)
    assert res.returncode == 0, res.stderr
    assert "PASS" in res.stdout
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert_matches_reference(manifest["summary"])

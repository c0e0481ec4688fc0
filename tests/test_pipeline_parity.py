"""TP x PP x DP training equals the one-process reference; recomputation changes no bit.

For (tp, pp, dp) in {(1,1,1), (2,1,1), (1,2,1), (1,4,1), (2,2,1), (2,2,2)}, with 1 and 4
micro-batches, every recompute mode, the distributed optimizer on and off (where dp > 1)
and SP on and off (where tp > 1): after 3 float64 steps every rank's parameters and the
losses agree with the unsharded reference to <= 1e-10 relative error, and the selective and
full recompute runs end with parameters bit-identical to the run without recomputation.
Pipelines of pp > 1 also run GPipe and interleaved 1F1B. Grids whose size equals the MPI
world run here (`make test`: 1, 2 and 4 ranks); the 8-rank grid runs in the 8-rank job
(`make test-mpi`).
"""
from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from mpi4py import MPI

from mpiemu.runner.job import run_workload

GRIDS = [(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 4, 1), (2, 2, 1), (2, 2, 2)]   # (tp, pp, dp)
TOLERANCE = 1e-10
GLOBAL_BATCH = 8


def overrides(tp: int, pp: int, dp: int, micro: int, recompute: str, dist: bool, sp: bool,
              schedule: str = "1f1b") -> list[str]:
    v = 2 if schedule == "interleaved" else 1
    return ["run.kind='train'", "run.iterations=3", "run.numerics='on'",
            "run.numeric_dtype='fp64'", f"parallel.tp={tp}", f"parallel.pp={pp}",
            f"parallel.dp={dp}", f"parallel.sequence_parallel={str(sp).lower()}",
            f"parallel.schedule='{schedule}'", f"parallel.virtual_stages={v}",
            "model.preset='tiny'", f"model.layers={4 * v}",
            f"train.global_batch={GLOBAL_BATCH}",
            f"train.micro_batch={GLOBAL_BATCH // dp // micro}", f"train.recompute='{recompute}'",
            f"optimizer.zero={int(dist)}", "train.check_reference=true",
            "train.dp_bucket_MiB=0.02"]


def cases(tp: int, pp: int, dp: int) -> list[tuple[int, bool, bool, str]]:
    """(micro-batches, distributed optimizer, SP, schedule) for one grid."""
    out = [(m, dist, sp, "1f1b") for m, dist, sp in itertools.product(
        (1, 4), (False, True) if dp > 1 else (False,), (False, True) if tp > 1 else (False,))]
    if pp > 1:
        out += [(4, dp > 1, tp > 1, "gpipe"), (4, dp > 1, tp > 1, "interleaved")]
    return out


def run_grid(tp: int, pp: int, dp: int, out: Path) -> None:
    """Every case of one grid on COMM_WORLD: reference parity and recompute bit-identity."""
    world = MPI.COMM_WORLD
    for micro, dist, sp, schedule in cases(tp, pp, dp):
        digests: dict[str, Any] = {}
        for recompute in ("none", "selective", "full"):
            tag = f"{tp}{pp}{dp}-m{micro}-{dist:d}{sp:d}-{schedule}-{recompute}"
            s = run_workload(None, overrides(tp, pp, dp, micro, recompute, dist, sp, schedule),
                             str(out / tag), [], world=world)
            if world.Get_rank() == 0:
                ref = s["reference"]
                assert ref["param_rel_err"] <= TOLERANCE and ref["passed"], (tag, ref)
                assert ref["loss_rel_err"] <= TOLERANCE, (tag, ref)
                digests[recompute] = (s["params_sha256"], [r["loss"] for r in s["iterations"]])
        if world.Get_rank() == 0:
            assert digests["selective"] == digests["none"], (tp, pp, dp, micro, dist, sp)
            assert digests["full"] == digests["none"], (tp, pp, dp, micro, dist, sp)


@pytest.mark.mpi
def test_grids_of_this_world_match_the_reference_and_recompute_is_bitwise(
        mpi_tmp_path: Path) -> None:
    grids = [g for g in GRIDS if g[0] * g[1] * g[2] == MPI.COMM_WORLD.Get_size()]
    if not grids:
        pytest.skip("no grid of the matrix has this many ranks")
    for tp, pp, dp in grids:
        run_grid(tp, pp, dp, mpi_tmp_path)

"""Folding with ZeRO-2 and ZeRO-3 / FSDP: every layer's reduce-scatter and, under ZeRO-3,
its parameter all-gathers (prefetched or not) are rings on the DP group, so a folded run's
every emulated rank equals the unfolded run's, bit for bit (experts' units too, over expert
DP). Hybrid sharding's blocks are
not shifts of one another: folding refuses it in one line."""
from __future__ import annotations

from pathlib import Path

import pytest

from mpiemu.analysis import load
from mpiemu.analysis.unfold import timeline_differences
from tests.conftest import run_mpi

TIMING = ["--set", "run.numerics=off", "--set", "train.check_reference=false",
          "--set", "run.iterations=2", "--set", "model.preset='tiny-llama'"]
# (name, overrides, emulated ranks, stages) on workloads/pipeline-small.toml (TP 2 x DP 2 x PP 2)
CASES = [
    ("zero3-tp-dp", ["parallel.pp=1", "train.global_batch=4", "optimizer.zero=3",
                     "network.preset=dgx-a100", "network.devices_per_node=2"], 4, 1),
    ("zero2-tp-dp-pp", ["optimizer.zero=2"], 8, 2),
    ("zero3-tp-dp-pp-no-prefetch", ["optimizer.zero=3", "optimizer.prefetch=false",
                                    "optimizer.reshard_after_forward=false"], 8, 2),
    # TP 2 x DP 4 on 4-GPU nodes: two DP ranks per node, so two classes of images
    ("zero3-tp2-dp4-two-per-node", ["parallel.pp=1", "parallel.dp=4", "train.global_batch=4",
                                    "optimizer.zero=3", "network.preset=dgx-a100",
                                    "network.devices_per_node=4"], 8, 2),
    # experts over EP 2 of DP 4: their units sharded over expert DP (two classes of images)
    ("zero3-experts-ep2-dp4", ["model.preset='tiny-moe'", "parallel.pp=1", "parallel.tp=1",
                               "parallel.dp=4", "parallel.ep=2", "train.global_batch=8",
                               "optimizer.zero=3", "moe.tokens='balanced'",
                               "network.preset=dgx-a100"], 4, 2),
]


@pytest.mark.parametrize("name, sets, full, stages", CASES, ids=[c[0] for c in CASES])
def test_folded_zero_run_equals_the_unfolded_run(tmp_path: Path, name: str, sets: list[str],
                                                 full: int, stages: int) -> None:
    extra = [x for s in sets for x in ("--set", s)]
    runs = {}
    for n in (full, stages):
        out = tmp_path / f"n{n}"
        res = run_mpi(n, ["run", "workloads/pipeline-small.toml", *TIMING, *extra,
                          "--out", str(out)])
        assert res.returncode == 0, res.stderr
        runs[n] = load(out)
    folded = runs[stages]
    assert [r.rank for r in folded.ranks] == list(range(full))
    assert timeline_differences(runs[full].ranks, folded.ranks) == []
    # the layers' gathers are in the timeline (the check compares something)
    names = {str(n) for n in runs[full].ranks[0].names}
    assert any(n.startswith("dp.grad_rs.L") for n in names)
    assert any(n.startswith("dp.param_ag.L") for n in names) == ("zero3" in name)
    assert any(n.startswith("edp.param_ag.L") for n in names) == ("experts" in name)


def test_hybrid_sharding_is_not_folded() -> None:
    from mpiemu.config.errors import ConfigError  # noqa: PLC0415
    from mpiemu.runner.fold_plan import plan_fold  # noqa: PLC0415
    from mpiemu.runner.job import validate  # noqa: PLC0415
    sets = ["run.numerics=off", "train.check_reference=false", "model.preset='tiny-llama'",
            "parallel.pp=1", "parallel.tp=1", "parallel.dp=4", "train.global_batch=4",
            "optimizer.zero=3", "optimizer.shard_group=2"]
    w = validate("workloads/pipeline-small.toml", sets, 4)
    with pytest.raises(ConfigError, match="optimizer.shard_group cuts DP into blocks"):
        plan_fold(w, 1)

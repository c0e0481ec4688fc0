"""Folding: a folded run's every emulated rank equals the unfolded run's, bit for bit, with
one process per stage or per class of images; folding that would not be exact is refused in
one line."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mpiemu.analysis import load
from mpiemu.analysis.unfold import timeline_differences
from mpiemu.comm.folded import FoldError, FoldedComm
from mpiemu.comm.shape import Fold, GridShape
from mpiemu.config.errors import ConfigError
from mpiemu.runner.fold_plan import plan_fold
from mpiemu.runner.job import validate
from tests.conftest import our_lines, run_mpi

TIMING = ["--set", "run.numerics=off", "--set", "train.check_reference=false",
          "--set", "run.iterations=2"]


def nodes(tp: int, dp: int, pp: int, *more: str) -> list[str]:
    """A TP x DP x PP grid on DGX A100 nodes (8 GPUs each unless `more` says otherwise)."""
    sets = ["network.preset=dgx-a100", f"parallel.tp={tp}", f"parallel.dp={dp}",
            f"parallel.pp={pp}", *more]
    return [a for s in sets for a in ("--set", s)]


LOCAL_DDP = ("optimizer.zero=0", "train.ddp=local", "train.overlap_grad_reduce=false")
# (name, workload, overrides, emulated ranks, processes of the folded run)
CASES = [
    ("tp-ring", "workloads/quickstart.toml",
     ["--set", "parallel.dp=1", "--set", "train.global_batch=4"], 2, 1),
    ("tp-dp-hierarchical", "workloads/pipeline-small.toml",
     ["--set", "parallel.pp=1", "--set", "train.global_batch=4", "--set",
      "network.preset=dgx-a100", "--set", "network.devices_per_node=2"], 4, 1),
    ("tp-pp-dp-1f1b", "workloads/pipeline-small.toml", [], 8, 2),
    # classes of images: TP inside 8-GPU nodes, DP across them (docs/folding.md)
    ("tp2-dp8-two-nodes-sp-zero1", "workloads/pipeline-small.toml",
     nodes(2, 8, 1, "train.global_batch=16", "optimizer.zero=1"), 16, 4),
    ("tp4-dp4-two-nodes-tree", "workloads/pipeline-small.toml",      # NCCL's tree and ring
     nodes(4, 4, 1, "optimizer.zero=0"), 16, 4),
    ("tp2-dp8-two-nodes-tree", "workloads/pipeline-small.toml",
     nodes(2, 8, 1, "train.global_batch=16", "optimizer.zero=0"), 16, 8),
    ("tp4-dp4-two-nodes-rings", "workloads/pipeline-small.toml",
     nodes(4, 4, 1, "optimizer.zero=0", "collectives.algorithm=ring"), 16, 2),
    ("tp4-dp8-four-nodes-zero1", "workloads/pipeline-small.toml",
     nodes(4, 8, 1, "train.global_batch=16"), 32, 2),
    ("tp2-dp16-four-nodes-zero1", "workloads/pipeline-small.toml",
     nodes(2, 16, 1, "train.global_batch=16"), 32, 4),
    ("tp2-dp4-pp2-tree-4-gpu-nodes", "workloads/pipeline-small.toml",
     nodes(2, 4, 2, "optimizer.zero=0", "network.devices_per_node=4"), 16, 8),
    # local DDP: one all-reduce of known size per stage, a ring by NCCL's tuner
    ("tp4-dp4-two-nodes-local-ddp", "workloads/pipeline-small.toml",
     nodes(4, 4, 1, *LOCAL_DDP), 16, 2),
    ("tp2-dp4-pp2-local-ddp-4-gpu-nodes", "workloads/pipeline-small.toml",
     nodes(2, 4, 2, *LOCAL_DDP, "network.devices_per_node=4", "model.hidden=256"), 16, 4),
    ("layer-sweep", "workloads/comp_vs_comm.toml",        # thesis ch. 5, TP x DP on 1 process
     ["--set", "parallel.dp=2", "--set", "layer_sweep.hidden=[1024, 2048]", "--set",
      "layer_sweep.seq_len=[1024]", "--set", "layer_sweep.batch=[1]", "--set",
      "layer_sweep.compute_scale=[1, 2]", "--set", "network.devices_per_node=0", "--set",
      "overlap.bidirectional=true"], 8, 1),
]


@pytest.mark.parametrize("name, workload, extra, full, stages", CASES,
                         ids=[c[0] for c in CASES])
def test_folded_run_equals_the_unfolded_run_per_emulated_rank(
        tmp_path: Path, name: str, workload: str, extra: list[str], full: int,
        stages: int) -> None:
    runs = {}
    for n in (full, stages):
        out = tmp_path / f"n{n}"
        res = run_mpi(n, ["run", workload, *TIMING, *extra, "--out", str(out)])
        assert res.returncode == 0, res.stderr
        runs[n] = load(out)
    folded = runs[stages]
    assert json.loads((tmp_path / f"n{stages}" / "manifest.json").read_text())["folded"]
    assert len(list((tmp_path / f"n{stages}").glob("rank-*.h5"))) == stages
    assert [r.rank for r in folded.ranks] == list(range(full))   # every emulated GPU
    assert timeline_differences(runs[full].ranks, folded.ranks) == []
    sweep = [(tmp_path / f"n{n}" / "layer_sweep.csv") for n in (full, stages)]
    if sweep[0].exists():                # the study's table itself, bit for bit
        assert sweep[0].read_text() == sweep[1].read_text()
    # the check can fail: an image is not its representative (other ports, other peers)
    assert not np.array_equal(folded.ranks[0].resources, folded.ranks[1].resources)
    if name == "tp-ring":           # analysis needs no MPI, folded or not
        for n in (full, stages):
            assert loaded_without_mpi(tmp_path / f"n{n}") == full


def loaded_without_mpi(run_dir: Path) -> int:
    """The emulated ranks `mpiemu.analysis.load` finds in a process where mpi4py cannot be
    imported at all."""
    code = ("import sys; sys.modules['mpi4py'] = None; import mpiemu.analysis as a; "
            f"print(len(a.load({str(run_dir)!r}).ranks))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    return int(res.stdout.strip())


def test_analyze_shows_every_emulated_rank_of_a_folded_run(tmp_path: Path) -> None:
    res = run_mpi(2, ["run", "workloads/pipeline-small.toml", *TIMING, "--out", str(tmp_path)])
    assert res.returncode == 0, res.stderr
    out = run_mpi(1, ["analyze", str(tmp_path), "--json"])
    assert out.returncode == 0, out.stderr
    ranks = json.loads(out.stdout)["ranks"]
    assert [r["rank"] for r in ranks] == list(range(8))


def test_a_fold_that_is_not_exact_stops_at_its_first_uneven_collective(tmp_path: Path) -> None:
    res = run_mpi(1, ["run", "workloads/pipeline-small.toml", *TIMING, "--set",
                      "parallel.tp=1", "--set", "parallel.pp=1", "--set", "parallel.dp=3",
                      "--set", "train.global_batch=6", "--set", "optimizer.zero=0",
                      "--out", str(tmp_path)])
    assert res.returncode != 0
    lines = [ln for ln in our_lines(res.stderr) if "FoldError" in ln]
    assert lines and "does not divide" in lines[0] and "run.fold" in lines[0]


@pytest.mark.parametrize("sets, world, needle", [
    (["run.numerics=on"], 2, "run.numerics = \"on\""),
    (["run.fold=on", "run.numerics=on"], 2, "folding mirrors timing only"),
    (["run.fold=off"], 2, "must equal the 2 ranks"),
    (["run.fold=on"], 8, "a job of 2 ranks (one per stage)"),
    (["run.fold=sometimes"], 2, "choose one of 'auto', 'on', 'off'"),
    (["parallel.pp=1", "train.global_batch=4", "device.preset=t3-gpu"], 1, "ring fabric"),
    (["parallel.pp=1", "train.global_batch=4", "optimizer.zero=0",
      "network.preset=dgx-a100", "network.devices_per_node=2"], 1, "tree"),
    (["parallel.pp=1", "parallel.tp=4", "parallel.dp=2", "train.global_batch=4",
      "network.preset=dgx-a100", "network.devices_per_node=2"], 1, "the tp group's all-reduce "
     "as a tree"),
    (["debug.fail_rank=1"], 2, "debug.fail_rank"),
])
def test_folds_that_cannot_be_exact_are_refused_in_one_line(
        sets: list[str], world: int, needle: str) -> None:
    args = [a for s in ["run.numerics=off", "train.check_reference=false", *sets]
            for a in ("--set", s)]
    with pytest.raises(ConfigError) as exc:
        validate("workloads/pipeline-small.toml", args[1::2], world)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_unfolded_launch_needs_no_fold() -> None:
    w = validate("workloads/pipeline-small.toml", ["run.numerics=off",
                                                   "train.check_reference=false"], 8)
    assert plan_fold(w, 8) is None
    assert plan_fold(w, 2) == Fold(GridShape(2, 2, 2))


def test_images_map_the_grid_onto_itself() -> None:
    fold = Fold(GridShape(2, 3, 2))
    assert fold.members(1) == [6, 7, 8, 9, 10, 11]
    for g in (fold.shape.shifter(a, b) for a, b in fold.shifts()):
        assert sorted(g(d) for d in range(12)) == list(range(12))
        assert all(g(d) // 6 == d // 6 for d in range(12))        # stages stay put


def test_mirror_answers_a_receive_with_this_ranks_own_send_the_other_way() -> None:
    m = FoldedComm.images("tp", 0, [0, 1, 2, 3])
    h = np.arange(5.0)
    m.Isend(h, 1, 100)                     # to offset +1
    got = np.empty(5)
    m.take(3, 100, got, 4.0)               # from offset -1: the image of that send
    assert np.array_equal(got, h)
    with pytest.raises(FoldError, match="never sent"):
        m.take(3, 100, got, None)
    m.Isend(h, 1, 100)
    with pytest.raises(FoldError, match="does not divide"):
        m.take(3, 100, got, 8.0)
    with pytest.raises(FoldError, match="spans pipeline stages"):
        FoldedComm("mp", 0, [0, 1, 2, 3], [0] * 4, mixed=True).Isend(h, 1, 100)


def test_a_folded_run_too_large_to_expand_loads_as_its_representatives(tmp_path: Path
                                                                        ) -> None:
    from mpiemu.analysis import format_tables
    res = run_mpi(2, ["run", "workloads/pipeline-small.toml", *TIMING, "--out", str(tmp_path)])
    assert res.returncode == 0, res.stderr
    run = load(tmp_path, expand=False)
    assert [r.rank for r in run.ranks] == [0, 4]
    assert run.stands_for == {0: [0, 1, 2, 3], 4: [4, 5, 6, 7]}
    assert "folded: 2 representatives stand for 8 emulated GPUs" in format_tables(run)[1]
    from mpiemu.analysis.export import chrome_trace
    names = {e["args"]["name"] for e in chrome_trace(run)["traceEvents"]
             if e.get("name") == "process_name"}
    assert names == {"rank 0 (stands for 4 GPUs: ranks 0-3)",
                     "rank 4 (stands for 4 GPUs: ranks 4-7)"}
    full = load(tmp_path)
    assert not full.stands_for and len(full.ranks) == 8


def test_studies_launch_one_process_per_stage_where_folding_is_exact() -> None:
    from mpiemu.studies.runs import processes
    wl = "workloads/pipeline-small.toml"
    assert processes(wl, ["run.numerics='off'", "train.check_reference=false"], 8) == 2
    assert processes(wl, [], 8) == 8                      # numerics on: every GPU a process

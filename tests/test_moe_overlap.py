"""The combined 1F1B schedule (`moe.overlap_ep_comm`, Megatron-Core's
--overlap-moe-expert-parallel-comm): one micro-batch's expert all-to-alls under another's
compute, the numbers unchanged, refused in one line where Megatron-Core refuses it or where it
is not modelled."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mpiemu.analysis import load
from mpiemu.analysis.experts import rank_all_to_all
from mpiemu.analysis.unfold import timeline_differences
from mpiemu.config.errors import ConfigError
from mpiemu.model.pipeline_schedules import Pass, combined_steps, in_flight, order
from mpiemu.runner.job import validate
from tests.test_moe import BASE, TIMING, WORKLOAD, run

GRID = ["parallel.dp=4", "parallel.ep=4", "train.global_batch=16", "train.micro_batch=1"]
ON = ["run.numerics='on'", "run.numeric_dtype='fp64'", "train.check_reference=true"]


def overlapped_a2as(run_dir: Path) -> tuple[int, int]:
    """(forward all-to-alls of rank 0's last iteration, those moving while a backward pass
    computes)."""
    df = load(run_dir).to_pandas()
    r = df[(df["rank"] == 0) & (df.iteration == df.iteration.max())]
    a2a = r[(r.resource == "coll.ep") & r.name.str.contains(r"\.(?:dispatch|combine)$")]
    comp = r[(r.resource == "compute") & (r.phase == "bwd")]
    hidden = sum(bool(((comp.t_start_s < e.t_end_s) & (comp.t_end_s > e.t_start_s)).any())
                 for e in a2a.itertuples())
    return len(a2a), hidden


def test_the_combined_order_pairs_each_forward_with_the_previous_backward() -> None:
    steps = combined_steps("1f1b", 1, 0, 3)
    assert steps == [[Pass("F", 0)], [Pass("F", 1), Pass("B", 0)],
                     [Pass("F", 2), Pass("B", 1)], [Pass("B", 2)]]
    assert in_flight([ps for s in steps for ps in s]) == 2


@pytest.mark.parametrize("grid, schedule", [
    (GRID, ("1f1b", 1, 4, 1)),
    # interleaved pipeline: 2 stages x 2 chunks of one layer each, 4 micro-batches of 2
    (["parallel.pp=2", "parallel.dp=2", "parallel.ep=2", "parallel.schedule='interleaved'",
      "parallel.virtual_stages=2", "model.layers=4", "train.global_batch=16",
      "train.micro_batch=2"], ("interleaved", 2, 4, 2)),
], ids=["one-stage", "interleaved-pp2"])
def test_the_numbers_are_unchanged_and_the_all_to_alls_hide(
        tmp_path: Path, grid: list[str], schedule: tuple[str, int, int, int]) -> None:
    """fp64 parity either way, bit-identical parameters and losses; with the schedule
    forward all-to-alls move under a backward's compute (none without: `mpiemu analyze`
    shows the hidden time per rank), the step is shorter, and each stage holds one more
    micro-batch, as the memory model counts."""
    runs = {ov: run(tmp_path / ov, 4, *ON, *grid, f"moe.overlap_ep_comm={ov}")
            for ov in ("false", "true")}
    summary = {ov: json.loads((d / "manifest.json").read_text())["summary"]
               for ov, d in runs.items()}
    assert all(s["reference"]["passed"] for s in summary.values())
    assert summary["true"]["params_sha256"] == summary["false"]["params_sha256"]
    assert [r["loss"] for r in summary["true"]["iterations"]] == \
        [r["loss"] for r in summary["false"]["iterations"]]
    assert overlapped_a2as(runs["true"])[1] > 0 == overlapped_a2as(runs["false"])[1]
    # `mpiemu analyze`'s per-rank table: the all-to-all time hidden under compute
    hidden = {ov: rank_all_to_all(load(d)).hidden_s for ov, d in runs.items()}
    assert (hidden["true"] > 0).all() and (hidden["false"] < 1e-12).all()
    end = {ov: load(d).to_pandas().t_end_s.max() for ov, d in runs.items()}
    assert end["true"] < end["false"]
    name, p, m, v = schedule
    held = {str(s): in_flight([ps for st in combined_steps(name, p, s, m, v) for ps in st])
            for s in range(p)}
    assert summary["true"]["in_flight"] == held
    assert all(n == in_flight(order(name, p, int(s), m, v)) + 1 for s, n in held.items())


def test_one_stage_hides_every_forward_all_to_all_but_the_first_micro_batch(tmp_path: Path
                                                                           ) -> None:
    total, hidden = overlapped_a2as(run(tmp_path / "one", 4, *TIMING, *GRID,
                                        "moe.overlap_ep_comm=true"))
    assert (total, hidden) == (2 * 2 * 4, 2 * 2 * 3)     # layers x (dispatch, combine) x mbs


def test_timing_is_the_same_with_numerics_and_folded(tmp_path: Path) -> None:
    """A numerics run's routing replayed timing only gives its timeline; in perfect
    balance the folded run (one process) gives the unfolded one's."""
    sets = [*GRID, "moe.overlap_ep_comm=true"]
    on = run(tmp_path / "on", 4, *ON, *sets)
    replay = run(tmp_path / "replay", 4, *TIMING, *sets, "moe.tokens='trace'",
                 f"moe.trace='{on / 'routing.npz'}'")
    assert timeline_differences(load(on).ranks, load(replay).ranks) == []
    full = load(run(tmp_path / "full", 4, *TIMING, *sets)).ranks
    folded = load(run(tmp_path / "folded", 1, *TIMING, *sets)).ranks
    assert timeline_differences(full, folded) == []


@pytest.mark.parametrize("extra, why", [
    (["parallel.ep=1"], "needs parallel.ep > 1"),
    (["moe.dispatcher='allgather'"], "needs moe.dispatcher = 'alltoall'"),
    (["train.recompute='full'"], "excludes train.recompute = 'full'"),
    (["moe.shared_ffn=32", "moe.shared_overlap=true"], "excludes moe.shared_overlap"),
    (["parallel.pp=2", "parallel.dp=2", "parallel.ep=2"],
     "needs parallel.schedule = 'interleaved' with parallel.pp > 1"),
    (["optimizer.zero=3"], "is modelled with optimizer.zero <= 2"),
])
def test_where_the_schedule_does_not_apply_it_is_refused_in_one_line(extra: list[str],
                                                                     why: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"moe.overlap_ep_comm=True: false, or: "
                                                    f"the combined 1F1B schedule {why}")) as e:
        validate(WORKLOAD, [*BASE, *TIMING, *GRID, "moe.overlap_ep_comm=true", *extra], 4)
    assert "\n" not in str(e.value)

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
from mpiemu.analysis.unfold import timeline_differences
from mpiemu.config.errors import ConfigError
from mpiemu.model.pipeline_schedules import Pass, combined_steps, in_flight
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
    steps = combined_steps(3)
    assert steps == [[Pass("F", 0)], [Pass("F", 1), Pass("B", 0)],
                     [Pass("F", 2), Pass("B", 1)], [Pass("B", 2)]]
    assert in_flight([ps for s in steps for ps in s]) == 2


def test_the_numbers_are_unchanged_and_the_all_to_alls_hide(tmp_path: Path) -> None:
    """fp64 parity either way, the same losses; with the schedule every forward
    all-to-all of micro-batches 1.. moves under a backward's compute, none without; the
    step is shorter."""
    runs = {ov: run(tmp_path / ov, 4, *ON, *GRID, f"moe.overlap_ep_comm={ov}")
            for ov in ("false", "true")}
    lines = {ov: (d / "manifest.json").read_text() for ov, d in runs.items()}
    assert all('"passed": true' in t for t in lines.values())
    total, hidden = overlapped_a2as(runs["true"])
    assert (total, hidden) == (2 * 2 * 4, 2 * 2 * 3)     # layers x (dispatch, combine) x mbs
    assert overlapped_a2as(runs["false"])[1] == 0
    end = {ov: load(d).to_pandas().t_end_s.max() for ov, d in runs.items()}
    assert end["true"] < end["false"]
    summary = {ov: json.loads(t)["summary"] for ov, t in lines.items()}
    assert summary["true"]["params_sha256"] == summary["false"]["params_sha256"]
    assert [r["loss"] for r in summary["true"]["iterations"]] == \
        [r["loss"] for r in summary["false"]["iterations"]]
    assert (summary["false"]["in_flight"], summary["true"]["in_flight"]) == ({"0": 1},
                                                                           {"0": 2})


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
    (["parallel.pp=2", "parallel.dp=2", "parallel.ep=2"], "is modelled with parallel.pp = 1"),
    (["optimizer.zero=3"], "is modelled with optimizer.zero <= 2"),
])
def test_where_the_schedule_does_not_apply_it_is_refused_in_one_line(extra: list[str],
                                                                     why: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"moe.overlap_ep_comm=True: false, or: "
                                                    f"the combined 1F1B schedule {why}")) as e:
        validate(WORKLOAD, [*BASE, *TIMING, *GRID, "moe.overlap_ep_comm=true", *extra], 4)
    assert "\n" not in str(e.value)

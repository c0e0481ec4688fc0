"""Mixture of Experts beyond parity: where token counts come from and what they cost.

Perfect balance moves the same bytes from every rank and each dispatch all-to-all takes the
closed form (`comm.cost.all_to_all_s`); a recorded routing trace replayed timing-only gives
the recording run's counts and times; a hand-made skewed trace makes every rank wait for
the busiest one; perfect balance folds bit for bit; bad input is refused in one line."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from mpiemu.analysis import load
from mpiemu.analysis.experts import expert_load, rank_all_to_all
from mpiemu.analysis.export import chrome_trace
from mpiemu.analysis.unfold import timeline_differences
from mpiemu.comm.cost import all_to_all_s
from mpiemu.comm.folded import FoldedComm
from mpiemu.comm.p2p import TimedComm
from mpiemu.config.errors import ConfigError
from mpiemu.config.workload import load_workload
from mpiemu.runner.job import validate
from mpiemu.sim.timeline import Timeline
from tests.conftest import run_mpi

WORKLOAD = "workloads/pipeline-small.toml"
BASE = ["run.kind='train'", "run.iterations=2", "model.preset='tiny-moe'", "model.layers=2",
        "optimizer.zero=0", "train.global_batch=8", "parallel.tp=1", "parallel.pp=1",
        "parallel.dp=1",
        "parallel.sequence_parallel=false", "train.dp_bucket_MiB=0.02"]
TIMING = ["run.numerics='off'", "train.check_reference=false"]


def run(out: Path, n: int, *extra: str) -> Path:
    args = [a for s in [*BASE, *extra] for a in ("--set", s)]
    res = run_mpi(n, ["run", WORKLOAD, *args, "--out", str(out)])
    assert res.returncode == 0, res.stderr
    return out


def a2a_events(run_dir: Path) -> "object":
    df = load(run_dir).to_pandas()
    return df[(df.resource == "coll.ep") & df.name.str.contains("dispatch$|combine$")]


def test_balanced_all_to_alls_move_equal_bytes_in_the_closed_form_time(tmp_path: Path
                                                                       ) -> None:
    out = run(tmp_path / "bal", 4, *TIMING, "parallel.dp=4", "parallel.ep=4")
    ev = a2a_events(out)
    assert ev.bytes.nunique() == 1 and len(ev) == 4 * 2 * 2 * 2 * 2   # ranks layers micro
    w = load_workload(WORKLOAD, [*BASE, *TIMING, "parallel.dp=4", "parallel.ep=4"])
    net = w.network_of(4)
    tc = TimedComm(FoldedComm.images("ep", 0, range(4)), Timeline(), net, "ep", devices=range(4))
    rows = 16 * 2 // 8 * 2                  # 16 tokens x top 2 over 8 experts, 2 per rank
    first = ev[(ev.iteration == 0) & (ev.name == "l0.dispatch")].groupby("rank").first()
    assert np.allclose(first.duration_s, all_to_all_s(tc, rows * 64 * 2), rtol=1e-9, atol=0)


@pytest.mark.parametrize("grid", [
    ["parallel.tp=2", "parallel.dp=2", "parallel.ep=2", "parallel.sequence_parallel=true"],
    # expert TP: peers' uneven received rows padded alike in both runs
    ["parallel.tp=2", "parallel.dp=2", "parallel.ep=2", "parallel.etp=2",
     "parallel.sequence_parallel=true"],
], ids=["ep2-tp2", "etp2-ep2-tp2"])
def test_a_replayed_trace_gives_the_recorded_counts_and_times(tmp_path: Path,
                                                              grid: list[str]) -> None:
    rec = run(tmp_path / "rec", 4, "run.numerics='on'", *grid)
    trace = rec / "routing.npz"
    rep = run(tmp_path / "rep", 4, *TIMING, *grid, "moe.tokens='trace'",
              f"moe.trace='{trace}'")
    recorded, replayed = np.load(trace), np.load(rep / "routing.npz")
    assert (recorded["counts"] == replayed["counts"]).all()
    assert recorded["counts"].sum() == 2 * 2 * 8 * 16 * 2     # iterations layers tokens k
    assert timeline_differences(load(rec).ranks, load(rep).ranks) == []


def test_a_skewed_trace_makes_every_rank_wait_for_the_busiest(tmp_path: Path) -> None:
    grid = ["parallel.dp=4", "parallel.ep=4"]
    bal = run(tmp_path / "bal", 4, *TIMING, *grid)
    skew = np.zeros((1, 1, 8 * 16, 2), np.int32)
    skew[..., 0], skew[..., 1] = 0, 1        # every token to experts 0 and 1: EP rank 0
    path = tmp_path / "skew.npz"
    np.savez(path, choices=skew, counts=np.zeros((1, 1, 4, 8)), experts=8, top_k=2)
    hot = run(tmp_path / "hot", 4, *TIMING, *grid, "moe.tokens='trace'",
              f"moe.trace='{path}'")
    b, h = load(bal).to_pandas(), load(hot).to_pandas()

    def step(df: "object", rank: int) -> float:
        it = df[(df["rank"] == rank) & (df.iteration == 1)]
        return float(it.t_end_s.max() - df[(df["rank"] == rank) & (df.iteration == 0)]
                     .t_end_s.max())

    def experts(df: "object", rank: int) -> float:       # the grouped GEMMs' time
        e = df[(df["rank"] == rank) & (df.iteration == 1) & df.name.str.contains(
            r"experts\.fc[12]\.")]
        return float(e.duration_s.sum())
    extra = experts(h, 0) - experts(b, 0)       # the busiest rank's extra expert work
    assert extra > 0 and experts(h, 1) == 0.0
    for r in range(4):                          # every rank waits for it
        assert step(h, r) - step(b, r) >= extra
    assert len({round(step(h, r), 12) for r in range(4)}) == 1
    # `mpiemu analyze`: the load it saw, and who waited in the all-to-alls
    hot_run = load(hot)
    assert set(expert_load(hot_run).max_over_mean) == {4.0}        # 2 of 8 experts take all
    assert set(expert_load(load(bal)).max_over_mean) == {1.0}
    waits = rank_all_to_all(hot_run).set_index("rank").wait_s
    assert all(waits[r] > waits[0] for r in (1, 2, 3))
    # the Perfetto export: each rank's tokens per expert, a counter per iteration
    counters = [e for e in chrome_trace(hot_run)["traceEvents"]
                if e.get("name") == "tokens sent per expert"]
    assert len(counters) == 4 * 2 and all(c["args"]["expert 2"] == 0 for c in counters)


def test_shared_experts_run_under_the_all_to_alls_when_overlapped(tmp_path: Path) -> None:
    grid = [*TIMING, "parallel.dp=4", "parallel.ep=4", "moe.shared_ffn=256"]
    off = load(run(tmp_path / "off", 4, *grid)).to_pandas()
    on = load(run(tmp_path / "on", 4, *grid, "moe.shared_overlap=true")).to_pandas()

    def first(df: "object", name: str) -> "object":
        return df[(df["rank"] == 0) & (df.iteration == 0) & (df.name == name)].iloc[0]
    a2a, fc1 = first(on, "l0.dispatch"), first(on, "l0.shared.fc1.fwd.gemm")
    assert a2a.t_start_s <= fc1.t_start_s < a2a.t_end_s    # under the dispatch
    assert first(off, "l0.shared.fc1.fwd.gemm").t_start_s >= first(off, "l0.combine").t_end_s
    assert on.t_end_s.max() < off.t_end_s.max()


@pytest.mark.parametrize("name, grid, launch", [
    ("ep-eq-tp", ["parallel.tp=2", "parallel.dp=2", "parallel.ep=2",
                  "parallel.sequence_parallel=true"], 1),
    ("ep-eq-dp-pp2", ["parallel.dp=2", "parallel.ep=2", "parallel.pp=2"], 2),
    ("ep1-dp4", ["parallel.dp=4"], 1),
    # EP over TP and DP: a TP shift reorders the EP group, so TP ranks are two classes
    ("ep-over-tp-and-dp", ["parallel.tp=2", "parallel.dp=2", "parallel.ep=4",
                           "parallel.sequence_parallel=true"], 2),
    ("ep2-dp4", ["parallel.dp=4", "parallel.ep=2"], 2),     # EP groups {0, 1}, {2, 3}
    # expert TP: groups {0, 1}, {2, 3} (a DP shift of 1 splits them); ETP = TP; ETP over DP
    ("etp2-ep2-dp4", ["parallel.dp=4", "parallel.ep=2", "parallel.etp=2"], 2),
    ("etp-eq-tp", ["parallel.tp=2", "parallel.dp=2", "parallel.etp=2",
                   "parallel.sequence_parallel=true"], 1),
    ("etp4-dp4-allgather", ["parallel.dp=4", "parallel.etp=4", "moe.dispatcher='allgather'"],
     1),
])
def test_balanced_experts_fold_exactly(tmp_path: Path, name: str, grid: list[str],
                                       launch: int) -> None:
    full = load(run(tmp_path / "full", 4, *TIMING, *grid)).ranks
    folded = load(run(tmp_path / "folded", launch, *TIMING, *grid)).ranks
    assert [r.rank for r in folded] == list(range(4))
    assert timeline_differences(full, folded) == []


@pytest.mark.parametrize("ranks, extra, field", [
    (4, ["parallel.dp=4", "parallel.ep=4", "moe.experts=6"],
     "parallel.ep=4: does not divide moe.experts=6"),
    (2, ["parallel.dp=2", "parallel.ep=3"], "parallel.ep=3: does not divide a stage's"),
    (2, ["parallel.dp=2", "parallel.ep=4"], "parallel.ep=4: does not divide a stage's"),
    (1, ["moe.top_k=9"], "moe.top_k=9: must be in 1..moe.experts=8"),
    (1, ["moe.capacity_factor=-0.5"], "moe.capacity_factor=-0.5: must be > 0"),
    (2, ["parallel.tp=2"], "parallel.sequence_parallel=False: must be true with experts"),
    (1, ["moe.tokens='skew'"], "moe.tokens='skew': with run.numerics='on'"),
    (2, ["model.preset='tiny-llama'", "parallel.dp=2", "parallel.ep=2"],
     "parallel.ep=2: needs a model with experts"),
    (1, ["moe.groups=3"], "moe.groups=3: must divide moe.experts=8"),
    (4, ["parallel.dp=4", "parallel.ep=4", "parallel.etp=2"],
     "parallel.ep*parallel.etp='4*2=8': does not divide a stage's tp*cp*dp = 4 ranks"),
    (2, ["parallel.dp=2", "parallel.etp=2", "moe.expert_ffn=33"],
     "parallel.etp=2: does not divide the experts' FFN width moe.expert_ffn=33"),
    (2, ["model.preset='tiny-llama'", "parallel.dp=2", "parallel.etp=2"],
     "parallel.etp=2: needs a model with experts"),
])
def test_bad_expert_settings_are_refused_in_one_line(ranks: int, extra: list[str],
                                                      field: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(field)) as exc:
        validate(WORKLOAD, [*BASE, *extra], ranks)
    assert "\n" not in str(exc.value)


def test_routing_traces_of_another_model_or_damaged_are_refused(tmp_path: Path) -> None:
    other = tmp_path / "other.npz"
    np.savez(other, choices=np.zeros((1, 1, 4, 2), np.int32), counts=np.zeros(1),
             experts=16, top_k=2)
    damaged = tmp_path / "damaged.npz"
    damaged.write_bytes(b"PK\x03\x04 not a zip")
    for path, why in ((other, "recorded with 16 experts"), (damaged, "not a readable")):
        with pytest.raises(ConfigError, match=f"moe.trace=.*{why}") as exc:
            validate(WORKLOAD, [*BASE, *TIMING, "moe.tokens='trace'", f"moe.trace='{path}'"],
                     1)
        assert "\n" not in str(exc.value)


def test_folding_refuses_routed_tokens_and_mixed_groups() -> None:
    with pytest.raises(ConfigError, match="only perfect balance"):
        validate(WORKLOAD, [*BASE, *TIMING, "parallel.dp=4", "moe.tokens='skew'"], 1)
    with pytest.raises(ConfigError, match=r"or 2 \(2 per stage.*the ep group \[0, 1, 2, 3\] "
                       "shifted by"):
        validate(WORKLOAD, [*BASE, *TIMING, "parallel.tp=2", "parallel.dp=2",
                            "parallel.sequence_parallel=true", "parallel.ep=4"], 1)

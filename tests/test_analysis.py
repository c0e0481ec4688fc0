"""Reading a run back: budgets, Perfetto/HTA export, comparison and Gantt plot."""
from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import numpy as np
import pytest

from mpiemu.analysis import load, rank_budget, union_length
from mpiemu.analysis.breakdown import BREAKDOWN_FIELDS, counted, iteration_breakdown, window_of
from mpiemu.analysis.compare import compare_lines
from mpiemu.analysis.export import chrome_trace
from mpiemu.analysis.hta import write_hta
from mpiemu.analysis.rank_trace import make_trace
from mpiemu.analysis.plot import gantt
from mpiemu.sim.timeline import Span, Timeline
from mpiemu.sim.trace import TraceWriter
from tests.conftest import run_mpi, run_quickstart


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("coll")
    res = run_mpi(2, ["run", "workloads/collectives.toml", "--set", "parallel.tp=2", "--set",
                      'collectives.sizes=["4KiB", "64KiB"]', "--out", str(out)])
    assert res.returncode == 0, res.stderr
    return out


def test_live_report_reads_blocks_since_the_mark_and_counts_what_analyze_counts(
        tmp_path: Path) -> None:
    """The per-iteration report (runner/train.py) reads the iteration back a block at a time
    and keeps only compute and collective events: same window, same breakdown as the whole
    iteration analysed at once."""
    writer = TraceWriter(tmp_path / "rank-00000.h5", {"rank": 0}, block_events=7)
    tl = Timeline(writer)
    for it in range(2):
        writer.mark()
        with tl.labelled(iteration=it):
            for k in range(10):
                tl.reserve(f"gemm{k}", ["compute"], 1e-3)
                tl.record("send", "comm", f"port.0.out>port.{k}.in", tl.now(),
                          tl.now() + 3e-3, 0.0, 64, 0.0, 1, -1, None)
                tl.summary("ar", Span(tl.now() - 5e-4, tl.now() + 2e-3), resource="coll.tp")
    fields = BREAKDOWN_FIELDS
    blocks = list(writer.blocks_since_mark(fields))
    assert len(blocks) > 2                                     # parts and buffered rows
    whole = np.concatenate(blocks)
    assert len(whole) == 30 and set(whole["iteration"]) == {1}
    rt_all = make_trace({"rank": 0}, whole, list(writer.strings))
    kept = make_trace({"rank": 0}, np.concatenate([b[counted(b)] for b in blocks]),
                      list(writer.strings))
    window = window_of(iter(blocks), 1)
    assert window == window_of([whole], 1) and window[1] > float(kept.events["t_end"].max())
    assert iteration_breakdown(kept, 1, window) == iteration_breakdown(rt_all, 1)


def test_union_length_counts_overlaps_once() -> None:
    import numpy as np
    assert union_length(np.array([0.0, 1.0, 5.0]), np.array([2.0, 3.0, 6.0])) == 4.0


def test_union_length_is_bit_for_bit_the_sequential_sweep() -> None:
    """Vectorized, it must still give the very float the sweep gave (study CSVs and goldens
    hold its sums)."""
    import numpy as np

    def sweep(starts: np.ndarray, ends: np.ndarray) -> float:
        order = np.argsort(starts, kind="stable")
        total, cur_s, cur_e = 0.0, float(starts[order[0]]), float(ends[order[0]])
        for i in order[1:]:
            a, b = float(starts[i]), float(ends[i])
            if a > cur_e:
                total += cur_e - cur_s
                cur_s, cur_e = a, b
            else:
                cur_e = max(cur_e, b)
        return total + cur_e - cur_s

    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 10, 100, 3000):
        for scale in (1e-3, 0.1, 1.0, 3.0):
            st = np.round(rng.random(n) * 10, int(rng.integers(1, 12)))
            en = st + rng.random(n) * scale
            assert union_length(st, en) == sweep(st, en), (n, scale)


def test_collective_only_run_has_all_time_exposed(run_dir: Path) -> None:
    b = rank_budget(load(run_dir).ranks[0])
    assert b.compute_s == 0.0 and b.collective_s > 0
    assert b.exposed_comm_s == pytest.approx(b.collective_s)


def test_chrome_trace_has_one_process_per_rank_and_well_nested_threads(run_dir: Path) -> None:
    doc = chrome_trace(load(run_dir))
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in slices} == {0, 1}
    by_thread: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for e in slices:
        by_thread.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_thread.values():           # Perfetto: slices on a thread must nest
        spans.sort()
        for (a0, a1), (b0, b1) in zip(spans, spans[1:]):
            assert b0 >= a1 - 1e-9 or b1 <= a1 + 1e-9


def test_hta_files_carry_their_rank_where_hta_looks(run_dir: Path, tmp_path: Path) -> None:
    for i, p in enumerate(write_hta(load(run_dir), tmp_path)):
        text = gzip.open(p, "rt").read()
        assert int(re.search(r'"rank":\s+(\d+)', text).group(1)) == i
        assert any(e.get("name", "").startswith("ncclKernel_")
                   for e in json.loads(text)["traceEvents"])


@pytest.fixture(scope="module")
def train_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_quickstart(tmp_path_factory.mktemp("train") / "run", 3)


def test_every_hta_kernel_has_a_launch_inside_its_profiler_step(train_dir: Path,
                                                                tmp_path: Path) -> None:
    """HTA assigns a kernel to an iteration through its launch (same correlation) and the
    ProfilerStep around the launch: every kernel of a 3-iteration run has both."""
    for p in write_hta(load(train_dir), tmp_path):
        ev = json.loads(gzip.open(p, "rt").read())["traceEvents"]
        steps = [(e["ts"], e["ts"] + e["dur"]) for e in ev
                 if e.get("cat") == "user_annotation"]
        launches = {e["args"]["correlation"]: e["ts"] for e in ev
                    if e.get("cat") == "cuda_runtime"}
        kernels = [e for e in ev if e.get("cat") == "kernel"]
        assert len(steps) == 3 and kernels and all(isinstance(e["ts"], float) for e in kernels)
        for k in kernels:       # strictly before: HTA's queue length sorts by time alone
            t = launches[k["args"]["correlation"]]
            assert t < k["ts"] and any(a <= t <= b for a, b in steps)
        # HTA's critical path keeps CPU events of positive duration, properly nested per thread
        by_thread: dict[int, list[tuple[int, int]]] = {}
        for e in ev:
            if e.get("cat") == "cuda_runtime":
                by_thread.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"]))
        spans = [sorted(v) for v in by_thread.values()]
        assert all(b0 <= a1 for v in spans for (_, b0), (a1, _) in zip(v, v[1:]))
        assert sum(b > a for v in spans for a, b in v) >= 0.9 * len(kernels)


@pytest.fixture(scope="module")
def t3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A T3 (fused GEMM + reduce-scatter, MCA) training run on the thesis's GPU."""
    return run_quickstart(tmp_path_factory.mktemp("t3") / "run", 3,
                          "overlap.strategy='t3-mca'", "device.preset='t3-gpu'")


@pytest.mark.parametrize("which", ["train_dir", "t3_dir"])
def test_hta_itself_analyses_the_export(which: str, request: pytest.FixtureRequest,
                                        tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                        ) -> None:
    """Runs when HTA is installed (`make test-hta` installs it in .venv-hta and requires it):
    every analysis HTA offers, the critical path included, on each of 3 iterations; its
    compute time in its own unit (us) is ours, and no launch queue goes negative."""
    import os
    from mpiemu.analysis.tables import rank_budget
    if os.environ.get("MPIEMU_REQUIRE_HTA"):
        import hta.trace_analysis as hta
    else:
        hta = pytest.importorskip("hta.trace_analysis")
    monkeypatch.setenv("HTA_DISABLE_NS_ROUNDING", "1")      # keep sub-microsecond kernels
    run = load(request.getfixturevalue(which))
    write_hta(run, tmp_path)
    # HTA drops a trace's last ProfilerStep unless asked (PyTorch's last step is partial)
    a = hta.TraceAnalysis(trace_dir=str(tmp_path), include_last_profiler_step=True)
    temporal = a.get_temporal_breakdown(visualize=False)
    assert len(temporal) == 2
    for _, row in temporal.iterrows():
        ours_us = rank_budget(run.ranks[int(row["rank"])]).compute_s * 1e6
        assert row["compute_time(us)"] == pytest.approx(ours_us, rel=1e-4)
    assert min(int(q["queue_length"].min()) for q in a.get_queue_length_time_series().values()
               if len(q)) >= 0
    assert len(a.get_gpu_kernel_breakdown(visualize=False)[0]) > 0
    a.get_comm_comp_overlap(visualize=False)
    a.get_idle_time_breakdown(visualize=False)
    for it in range(3):
        graph, ok = a.critical_path_analysis(rank=1, annotation="ProfilerStep", instance_id=it)
        kernels = {graph.node_list[n].ev_idx for n in graph.critical_path_nodes}
        assert ok and len(kernels) > 10, (it, len(kernels))


def test_compare_of_a_run_with_itself_is_no_change(run_dir: Path) -> None:
    lines = compare_lines(load(run_dir), load(run_dir))
    assert "1.0000x" in lines[2]
    ops = [line.split()[0] for line in lines[5:]]
    assert ops == sorted(ops)       # every change ties at zero: the table orders them by name


def test_gantt_writes_a_png(run_dir: Path, tmp_path: Path) -> None:
    out = gantt(load(run_dir), tmp_path / "t.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_critical_path_covers_the_makespan_without_gaps(run_dir: Path) -> None:
    from mpiemu.analysis.critical_path import critical_path
    run = load(run_dir)
    path = critical_path(run)
    assert sum(p.t_end - p.t_start for p in path) == pytest.approx(run.makespan, rel=1e-9)
    for later, earlier in zip(path, path[1:]):       # a contiguous chain back to t = 0
        assert earlier.t_end == pytest.approx(later.t_start, abs=1e-15)
    assert path[-1].t_start == 0.0


def test_select_filters_events_for_notebooks(run_dir: Path) -> None:
    rt = load(run_dir).ranks[0]
    sends = rt.select(cat="comm", prefix="rs.")
    assert sends.any() and set(rt.names[sends]) <= {"rs.send", "rs.reduce"}
    assert not rt.select(cat="compute").any()


def test_every_message_has_one_flow_arrow_and_ports_have_counters(run_dir: Path) -> None:
    """Perfetto: a flow pair from each sender slice to its receiver's `in:` slice; a
    utilisation counter per port; thread 0 named."""
    run = load(run_dir)
    doc = chrome_trace(run)["traceEvents"]
    sends = sum(1 for rt in run.ranks for i, res in enumerate(rt.resources)
                if rt.cats[i] == "comm" and res.split(".")[0] in ("port", "link", "nic"))
    starts = [e for e in doc if e["ph"] == "s"]
    ends = [e for e in doc if e["ph"] == "f"]
    assert sends > 0 and len(starts) == len(ends) == sends
    assert {e["id"] for e in starts} == {e["id"] for e in ends}
    assert all(s["pid"] != f["pid"] for s, f in zip(sorted(starts, key=lambda e: e["id"]),
                                                    sorted(ends, key=lambda e: e["id"])))
    counters = [e for e in doc if e["ph"] == "C"]
    assert counters and all(0.0 <= e["args"]["busy"] <= 1.0 + 1e-9 for e in counters)
    assert any(e["ph"] == "M" and e["tid"] == 0 and e["name"] == "thread_name" for e in doc)


def test_json_outputs_and_dataframe(run_dir: Path) -> None:
    """`analyze --json`, `compare --json` parse; `to_pandas` holds every event, in seconds."""
    out = run_mpi(1, ["analyze", str(run_dir), "--json"])
    data = json.loads(out.stdout)
    assert data["status"] == "complete" and len(data["ranks"]) == 2 and data["ops"]
    cmp = json.loads(run_mpi(1, ["compare", str(run_dir), str(run_dir), "--json"]).stdout)
    assert cmp["speedup"] == pytest.approx(1.0)
    run = load(run_dir)
    df = run.to_pandas()
    assert len(df) == sum(len(rt.events) for rt in run.ranks)
    assert df["t_end_s"].max() == pytest.approx(run.makespan)


def test_every_op_is_listed_when_asked_and_in_json(train_dir: Path) -> None:
    """`--top -1` lists every op (it used to drop the last), JSON every op unless `--top`."""
    from mpiemu.analysis.summary import format_tables, summary_dict
    from mpiemu.analysis.tables import op_totals
    run = load(train_dir)
    n = len(op_totals(run))
    assert n > 25 and len(summary_dict(run)["ops"]) == n        # type: ignore[arg-type]
    lines = format_tables(run, top=-1)
    head = next(i for i, ln in enumerate(lines) if ln.startswith("op "))
    assert lines[head + n] != "" and lines[head + n + 1] == ""
    assert len(summary_dict(run, 5)["ops"]) == 5                # type: ignore[arg-type]


def test_compare_says_when_two_runs_are_not_like_for_like(run_dir: Path,
                                                          train_dir: Path) -> None:
    from mpiemu.analysis.compare import compare_dict
    lines = compare_lines(load(run_dir), load(run_dir))
    assert not any(ln.startswith("note:") for ln in lines)
    notes = compare_dict(load(run_dir), load(train_dir))["notes"]
    assert any("different configurations" in n for n in notes)  # type: ignore[union-attr]


def test_an_export_takes_the_ranks_iterations_and_window_asked_for(train_dir: Path,
                                                                    tmp_path: Path) -> None:
    from mpiemu.analysis.select import parse_ids, parse_window, select
    run = load(train_dir)
    part = select(run, parse_ids("1", "--ranks"), parse_ids("1-2", "--iterations"),
                  parse_window("0.5:"))
    assert [rt.rank for rt in part.ranks] == [1]
    ev = part.ranks[0].events
    assert set(ev["iteration"].tolist()) <= {1, 2} and (ev["t_end"] >= 0.5e-3).all()
    assert 0 < len(ev) < len(run.ranks[1].events)
    trace = chrome_trace(part)
    pids = {e["pid"] for e in trace["traceEvents"] if e.get("ph") == "X"}
    assert len(pids) == 1 and len(trace["traceEvents"]) < len(chrome_trace(run)["traceEvents"])
    with pytest.raises(ValueError, match="--window"):
        parse_window("2:1")
    with pytest.raises(ValueError, match="--ranks"):
        parse_ids("a-b", "--ranks")


def test_gantt_rows_keep_what_the_window_shows(train_dir: Path, tmp_path: Path) -> None:
    from mpiemu.analysis.plot import gantt_rows
    run = load(train_dir)
    every = gantt_rows(run)
    assert every and all(len(r.t0) for r in every)
    assert gantt_rows(run, t_min_ms=run.makespan * 1e3 + 1) == []       # past the end
    ends = [float(r.t1.max()) for r in gantt_rows(run, t_max_ms=0.0)]
    assert len(ends) < len(every) or all(e >= 0 for e in ends)
    assert {r.label.split()[0] for r in gantt_rows(run, ranks=[1])} == {"r1"}
    out = gantt(run, tmp_path / "t.png", t_min_ms=0.0, t_max_ms=0.5, ranks=[0])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

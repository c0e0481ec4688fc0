"""Perfetto's protobuf export read back: the JSON export's tracks, slices, flows and counters,
at a tenth of its size."""
from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from mpiemu.analysis import load
from mpiemu.analysis.export import chrome_trace
from mpiemu.analysis.perfetto_proto import write_perfetto
from mpiemu.cli import main
from tests.conftest import run_quickstart

pb = pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")

Key = tuple[str, str]        # (process name, track name)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_quickstart(tmp_path_factory.mktemp("proto") / "run", 6)


def read_pftrace(path: Path) -> dict[str, Any]:
    """Decode a trace as Perfetto's importer does: track descriptors, per-sequence state
    (defaults, interned names, the incremental clock), begin / end pairs, counters, flows."""
    trace = pb.Trace()
    trace.ParseFromString(path.read_bytes())
    procs: dict[int, str] = {}
    tracks: dict[int, Key] = {}
    track_cat: dict[int, str] = {}
    seqs: dict[int, dict[str, Any]] = {}
    slices: dict[Key, list[tuple[str, str, int, int]]] = defaultdict(list)
    counters: dict[Key, list[tuple[int, float]]] = defaultdict(list)
    flows: dict[int, dict[str, Key]] = defaultdict(dict)
    for p in trace.packet:
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            if d.HasField("process"):
                procs[d.uuid] = d.process.process_name
            else:
                tracks[d.uuid] = (procs[d.parent_uuid], d.name)
                track_cat[d.uuid] = d.description.removeprefix("category of every slice: ")
            continue
        if p.sequence_flags & 1:      # SEQ_INCREMENTAL_STATE_CLEARED
            clocks = {c.clock_id: c for c in p.clock_snapshot.clocks}
            assert clocks[64].is_incremental and p.trace_packet_defaults.timestamp_clock_id == 64
            seqs[p.trusted_packet_sequence_id] = {
                "now": clocks[64].timestamp, "names": {}, "cats": {}, "open": None,
                "track": p.trace_packet_defaults.track_event_defaults.track_uuid}
        st = seqs[p.trusted_packet_sequence_id]
        st["names"].update({e.iid: e.name for e in p.interned_data.event_names})
        st["cats"].update({e.iid: e.name for e in p.interned_data.event_categories})
        if not p.HasField("track_event"):
            continue
        st["now"] += p.timestamp
        te, key = p.track_event, tracks[st["track"]]
        if te.type == 1:
            assert st["open"] is None, "slices on one track never overlap"
            name = st["names"][te.name_iid] if te.HasField("name_iid") else te.name
            cat = st["cats"][te.category_iids[0]] if te.category_iids else \
                track_cat[st["track"]]
            st["open"] = (name, cat, st["now"])
            for f in te.flow_ids:
                flows[f]["from"] = key
            for f in te.terminating_flow_ids:
                flows[f]["to"] = key
        elif te.type == 2:
            slices[key].append((*st["open"], st["now"]))
            st["open"] = None
        else:
            counters[key].append((st["now"], te.counter_value or te.double_counter_value))
    return {"slices": slices, "counters": counters, "flows": flows}


def json_view(doc: dict[str, Any]) -> dict[str, Any]:
    """The same view of the JSON export (times in ns, counters without repeats)."""
    ev = doc["traceEvents"]
    pname = {e["pid"]: e["args"]["name"] for e in ev if e.get("name") == "process_name"}
    tname = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev
             if e.get("name") == "thread_name"}
    slices: dict[Key, list[tuple[str, str, float, float]]] = defaultdict(list)
    counters: dict[Key, list[tuple[float, float]]] = defaultdict(list)
    for e in ev:
        if e["ph"] == "X":
            slices[(pname[e["pid"]], tname[(e["pid"], e["tid"])])].append(
                (e["name"], e["cat"], e["ts"] * 1e3, (e["ts"] + e["dur"]) * 1e3))
        elif e["ph"] == "C":
            for k, v in e["args"].items():
                name = e["name"] if len(e["args"]) == 1 else f"{e['name']}: {k}"
                series = counters[(pname[e["pid"]], name)]
                if not series or series[-1][1] != v:
                    series.append((e["ts"] * 1e3, v))
    ends = Counter((pname[e["pid"]], e["ph"]) for e in ev if e["ph"] in "sf")
    return {"slices": slices, "counters": counters, "flow_ends": ends}


def test_the_protobuf_holds_the_json_exports_slices_counters_and_flows(run_dir: Path,
                                                                        tmp_path: Path) -> None:
    run = load(run_dir)
    ours = read_pftrace(write_perfetto(run, tmp_path / "t.pftrace"))
    ref = json_view(chrome_trace(run))
    assert set(ours["slices"]) == set(ref["slices"])
    for key, want in ref["slices"].items():
        got = sorted(ours["slices"][key], key=lambda s: (s[2], s[3]))
        want = sorted(want, key=lambda s: (s[2], s[3]))
        assert [s[:2] for s in got] == [s[:2] for s in want], key
        # whole nanoseconds: each time within a rounding of the JSON's
        assert max(abs(g[i] - w[i]) for g, w in zip(got, want) for i in (2, 3)) <= 1.0, key
    assert ours["counters"].keys() == ref["counters"].keys()
    for key, want in ref["counters"].items():
        got = ours["counters"][key]
        assert [v for _, v in got] == pytest.approx([v for _, v in want], abs=1e-9), key
        assert max(abs(g[0] - w[0]) for g, w in zip(got, want)) <= 1.0
    flows = ours["flows"]
    assert flows and all(set(f) == {"from", "to"} for f in flows.values())
    assert all(">" in f["from"][1] and f["to"][1].startswith("in:") for f in flows.values())
    sent = Counter(f["from"][0] for f in flows.values())
    recv = Counter(f["to"][0] for f in flows.values())
    assert sent == Counter({p: n for (p, ph), n in ref["flow_ends"].items() if ph == "s"})
    assert recv == Counter({p: n for (p, ph), n in ref["flow_ends"].items() if ph == "f"})


def test_the_protobuf_is_under_a_tenth_of_the_json(run_dir: Path, tmp_path: Path) -> None:
    assert main(["export", str(run_dir), "--perfetto", str(tmp_path / "t.pftrace"),
                 "--chrome", str(tmp_path / "t.json")]) == 0
    ratio = (tmp_path / "t.pftrace").stat().st_size / (tmp_path / "t.json").stat().st_size
    assert ratio < 0.10, ratio


def test_a_filtered_protobuf_export_holds_only_what_was_asked(run_dir: Path,
                                                              tmp_path: Path) -> None:
    out = tmp_path / "r1.pftrace"
    assert main(["export", str(run_dir), "--perfetto", str(out), "--ranks", "1",
                 "--iterations", "2"]) == 0
    slices = read_pftrace(out)["slices"]
    assert {p for p, _ in slices} == {"rank 1"}
    assert [s[0] for s in slices[("rank 1", "iterations (ProfilerStep)")]] == ["ProfilerStep#2"]

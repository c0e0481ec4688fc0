"""Golden tests: every study's CSV regenerated from the models equals the committed one.

A failure prints a unified diff of the CSV rows (committed vs regenerated): a model constant
changed, so either the change is a bug or `mpiemu report NAME` must be rerun and committed
with the README explaining the move. The t3 study regenerates its tp=8 half (8 ranks).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from mpiemu.studies import STUDIES, study_module
from mpiemu.studies.common import ROOT, Golden, golden_diff, load_figures


@pytest.mark.parametrize("name", sorted(STUDIES))
def test_regenerated_csv_equals_the_committed_one(name: str) -> None:
    goldens: list[Golden] = study_module(name).golden()
    assert goldens, f"study {name} checks no CSV"
    problems: list[str] = []
    for g in goldens:
        problems += golden_diff(ROOT / "results" / name / g.csv, g)
    assert not problems, "\n".join([f"results/{name} differs from the models:", *problems])


@pytest.mark.parametrize("name", sorted(STUDIES))
def test_every_paper_figure_has_a_source(name: str) -> None:
    figures = load_figures(name)
    assert figures and all(f.source.strip() for f in figures.values())


def test_a_changed_row_is_shown_as_a_readable_diff(tmp_path: Path) -> None:
    committed = tmp_path / "x.csv"
    committed.write_text("a,b\n1,2.5\n3,4\n")
    lines = golden_diff(committed, Golden("x.csv", [{"a": 1, "b": 2.5}, {"a": 3, "b": 4.25}]))
    assert "-3,4" in lines and "+3,4.25" in lines


def test_collectives_data_sets_are_named_consistently() -> None:
    """Every data set a setup or the latency-scale fit names has its source and its measured
    rows, and the fit's data sets are exactly the ones `calibrated` treats as fitted (a
    mistyped name would silently move a data set between fitted and held out)."""
    from mpiemu.studies import collectives as c
    named = {d for s in c.setups() for d in s["datasets"]}
    fit = set(c.calibration()["datasets"])
    rows = c.measured()
    assert fit <= named and named <= set(c.sources())
    assert named <= {r["dataset"] for r in rows}
    fake = [{"dataset": d} for d in named]
    assert c.calibrated(fake) == fit


def test_network_presets_hold_the_fitted_latency_scales() -> None:
    """The committed calibration grid (`mpiemu report collectives --calibrate`) and the
    NCCL-derived network presets agree: every preset with a call scale holds the grid's
    fitted point, so a refit that is not copied into the presets fails here."""
    from mpiemu.net import list_networks, load_network
    from mpiemu.studies import collectives as c
    table = c.read_calibration(ROOT / "results" / "collectives" / "calibration.csv")
    best = c.fit(table)
    cal = c.calibration()
    assert len(table) == len(cal["call"]) * len(cal["hop"]["ll"]) * \
        len(cal["hop"]["ll128"]) * len(cal["hop"]["simple"])
    fitted = [n for n in list_networks() if load_network(n).call_latency_scale != 1.0]
    assert fitted
    for name in fitted:
        net = load_network(name)
        assert (net.call_latency_scale, net.hop_scale("ll"), net.hop_scale("ll128"),
                net.hop_scale("simple")) == (best["call"], best["hop_ll"], best["hop_ll128"],
                                             best["hop_simple"]), name


def test_calibration_text_names_the_fit_and_the_forms_it_beat() -> None:
    """The report's calibration sentence takes the grid's least mean error as the fit and
    quotes the best one-factor point and the best point with NCCL's hop latencies."""
    from mpiemu.studies.collectives import fit
    from mpiemu.studies.collectives_report import _calibration_text

    def row(call: float, ll: float, ll128: float, simple: float, big: float,
            every: float) -> dict[str, float]:
        return {"call": call, "hop_ll": ll, "hop_ll128": ll128, "hop_simple": simple,
                "error_1MiB_up": big, "error_all": every}
    table = [row(3, 1, 1, 3, 0.02, 0.05), row(3, 3, 3, 3, 0.04, 0.09),
             row(2, 2, 2, 2, 0.05, 0.07), row(3, 1, 1, 1, 0.04, 0.07),
             row(2, 1, 1, 1, 0.03, 0.20)]
    assert fit(table) is table[0]
    text = _calibration_text(table, ["a", "b"])
    assert "the fit gives 2.0% from 1 MiB up and 5.0%" in text
    assert "one factor on every latency (2) gives 5.0% from 1 MiB up and 7.0%" in text
    assert "hop latencies as they are (call 3) gives 4.0% from 1 MiB up and 7.0%" in text
    assert "(5 grid points" in text


def test_llama_rows_cover_every_bf16_measurement() -> None:
    """results/llama/rows.csv holds every BF16 row of llama_measured.toml, in order, each with
    our number or the reason it was not emulated (never both, never neither)."""
    from mpiemu.studies import llama
    from mpiemu.studies.common import read_csv
    rows = read_csv(ROOT / "results" / "llama" / "rows.csv")
    assert [r["id"] for r in rows] == [m["id"] for m in llama.measured()]
    assert all(bool(r["ours"]) != bool(r["not_emulated"]) for r in rows)


def test_llama_overrides_follow_each_row_and_its_notes() -> None:
    """Every layout value comes from the row; the notes add what they state (overlapped
    parameter gather, the 405B proxy's vocabulary and KV heads, no clipping, eager kernels)."""
    from mpiemu.studies.llama import measured, overrides
    rows = {r["id"]: r for r in measured()}

    def sets(row_id: str) -> list[str]:
        return overrides(rows[row_id])
    s = sets("dgxc-v24.11.1-nemo-llama3.1-8b-bf16-8gpu")
    assert {"parallel.cp=2", "parallel.dp=4", "model.seq_len=8192", "optimizer.zero=1",
            "optimizer.overlap_param_gather=true", "parallel.sequence_parallel=false"} <= set(s)
    assert "optimizer.overlap_param_gather=true" not in sets(
        "dgxc-v25.04-nemo2-llama3.1-8b-bf16-8gpu")
    s = sets("dgxc-v24.11.1-nemo-llama3.1-405b-bf16-576gpu")
    assert {"parallel.schedule='interleaved'", "parallel.virtual_stages=7",
            "parallel.sequence_parallel=true", "model.vocab=50257", "model.kv_heads=16"} <= set(s)
    assert {"optimizer.zero=3", "optimizer.clip_grad_norm=0.0", "train.recompute='full'"} <= \
        set(sets("automodel-2026-04-llama3.1-70b-bf16-64gpu"))
    assert "train.kernels='unfused'" in sets("torchtitan-2024-12-llama3.1-8b-bf16-8gpu")
    assert "train.kernels='unfused'" not in sets("torchtitan-2024-12-llama3.1-8b-bf16-compile-8gpu")
    assert all(len({x.split("=")[0] for x in overrides(r)}) == len(overrides(r))
               for r in rows.values())


def test_moe_rows_cover_every_bf16_measurement() -> None:
    """results/moe/rows.csv holds every BF16 row of moe_measured.toml, in order, each with our
    number or the reason it was not emulated (never both, never neither)."""
    from mpiemu.studies import moe
    from mpiemu.studies.common import read_csv
    rows = read_csv(ROOT / "results" / "moe" / "rows.csv")
    assert [r["id"] for r in rows] == [m["id"] for m in moe.measured()]
    assert all(bool(r["ours"]) != bool(r["not_emulated"]) for r in rows)


def test_moe_overrides_follow_each_row() -> None:
    """Every layout value comes from the row (FSDP as ZeRO-3, the experts sharded over
    expert DP), expert TP where the row has it; the notes add what they state; rows without
    a preset are not run, saying why; DeepSeek-V3's runs with its latent attention, its
    multi-token prediction listed as not modelled."""
    from mpiemu.studies.moe import measured, not_expressed, overrides, routing_label
    from mpiemu.studies.moe_rows import emulated_with
    rows = {r["id"]: r for r in measured()}
    s = overrides(rows["automodel-2025-10-qwen3-30b-a3b-bf16-8gpu"])
    assert {"parallel.dp=8", "parallel.ep=8", "train.micro_batch=4", "train.recompute='full'",
            "optimizer.zero=3", "optimizer.clip_grad_norm=0.0", "moe.capacity_factor=0.0",
            "parallel.sequence_parallel=false"} <= set(s)
    s = overrides(rows["modelzoo-qwen3-235b-a22b-bf16-256gpu-deepep-ep32"])
    assert {"parallel.tp=2", "parallel.sequence_parallel=true", "parallel.virtual_stages=4",
            "parallel.embedding_in_split=true", "train.recompute='none'"} <= set(s)
    drop = rows["modelzoo-mixtral-8x22b-bf16-128gpu-token-drop"]
    assert "moe.capacity_factor=1.0" in overrides(drop)
    assert routing_label(drop).startswith("token drop")
    assert routing_label(rows["dgxc-v25.05-nemo2-deepseek-v3-bf16-1024gpu"]) != "forced balance"
    assert not_expressed(rows["dgxc-v24.11.1-nemo-grok1-314b-bf16-512gpu"]).startswith("no preset")
    assert "parallel.etp=4" in overrides(rows["dgxc-v24.11.1-nemo-grok1-314b-bf16-512gpu"])
    deepseek = rows["automodel-2025-10-deepseek-v3-bf16-256gpu"]
    assert not_expressed(deepseek) == ""
    assert any("multi-token-prediction" in c for c in emulated_with(deepseek,
                                                                     overrides(deepseek)))
    assert not_expressed(rows["automodel-2025-10-qwen3-30b-a3b-bf16-8gpu"]) == ""
    assert all(len({x.split("=")[0] for x in overrides(r)}) == len(overrides(r))
               for r in rows.values())


def test_moe_flop_counts_reproduce_the_printed_tflops(tmp_path: Path) -> None:
    """Each source's FLOP count (`moe.toml [flop_conventions]`: Megatron's with MLA and MTP
    for DeepSeek-V3, Megatron's for Qwen3-235B, AutoModel's for Qwen3-30B) times the source's
    own throughput gives the model TFLOP/s it prints, within 1%."""
    from mpiemu.studies import moe
    checks = moe.flop_checks(moe.write_workload(tmp_path))
    assert {c["convention"] for c in checks} == {"megatron", "automodel_qwen3"}
    assert all(abs(c["difference"]) < 0.01 for c in checks), checks

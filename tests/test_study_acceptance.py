"""Each study's published-agreement goals, asserted on its committed results.

The golden tests freeze a study's numbers; these check that the numbers still agree with the
papers and measurements they are judged against, each by the study's own goal (its
figures file). A change that moves a study away from its figures fails here even after
`make goldens`. Known misses are listed, each with its reason; a miss that disappears must
leave the list too (the list stays honest).
"""
from __future__ import annotations

import csv
import re

import pytest

from mpiemu.studies.common import ROOT, load_figures


def rows(study: str, name: str) -> list[dict[str, str]]:
    with open(ROOT / "results" / study / name, newline="") as f:
        return list(csv.DictReader(f))


def check(misses: dict[str, bool], known: dict[str, str]) -> None:
    """Every key that misses its goal is a known miss, and every known miss still misses."""
    assert {k for k, miss in misses.items() if miss} == set(known)


def test_t3_geomeans_within_the_thesis_and_ordered() -> None:
    fig = load_figures("t3")
    tol = float(fig["acceptance_pp"])
    g = {r["strategy"]: float(r["geomean_speedup"]) for r in rows("t3", "summary.csv")}
    for s in ("ideal", "t3", "t3-mca"):
        assert abs(g[s] - float(fig[f"{s}_geomean"])) <= tol, s
    assert 0 < g["t3"] < g["t3-mca"] <= g["ideal+nmc"] + 1e-12


@pytest.mark.parametrize("name", ["layers.csv", "iterations.csv"])
def test_megatron_times_within_the_goal(name: str) -> None:
    goal = float(load_figures("megatron")["goal"])
    check({r["run"]: abs(float(r["difference"])) > goal for r in rows("megatron", name)}, {})


def test_sunway_required_speedups_within_the_seed() -> None:
    tol = float(load_figures("sunway")["acceptance_rel"])
    req = [r for r in rows("sunway", "seed.csv") if r["required"] == "True"]
    assert req
    check({r["figure"]: abs(float(r["ours"]) / float(r["seed"]) - 1) > tol for r in req}, {})


def test_softmax_required_figures_within_the_seed() -> None:
    fig = load_figures("softmax")
    tol = {"share": float(fig["acceptance_share_pp"]),
           "speedup": float(fig["acceptance_speedup_rel"])}
    misses = {}
    for r in rows("softmax", "seed.csv"):
        if r["required"] != "True":
            continue
        ours, seed = float(r["ours"]), float(r["seed"])
        diff = ours - seed if r["kind"] == "share" else ours / seed - 1
        misses[f"{r['figure']} {r['model']} {r['gpu']}"] = abs(diff) > tol[r["kind"]]
    check(misses, {
        # results/softmax/README.md lists it outside the 10% tolerance (ours faster than
        # the seed's measurement on that GPU); no cause is established
        "SDF over baseline BERT-Large rtx3090": "outside, cause not established",
    })


def test_kernels_judged_rows_within_the_goal() -> None:
    goal = float(load_figures("kernels")["acceptance_geomean"])
    judged = {r["gpu"]: float(r["geomean_abs_error"]) for r in rows("kernels", "summary.csv")
              if r["set"] == "judge"}
    assert judged["all"] <= goal


def test_fusion_statements_hold() -> None:
    check({r["statement"][:4]: r["holds"] != "True" for r in rows("fusion", "statements.csv")},
          {
              # results/fusion/README.md: our untiled (3072) fused MLP is faster than tile
              # 1536 on every GPU count, where the seed measures it slightly slower; no
              # cause is established
              "V19:": "untiled faster in our model",
          })


def test_collectives_data_sets_within_the_targets() -> None:
    lo, hi = (float(x) for x in load_figures("collectives")["targets"].value)
    misses = {}
    for r in rows("collectives", "summary.csv"):
        big = float(r["geomean_abs_error_1MiB_up"]) if r["geomean_abs_error_1MiB_up"] else 0.0
        misses[r["dataset"]] = big > lo or float(r["geomean_abs_error_all"]) > hi
    check(misses, {
        # results/collectives/README.md, "Across nodes" and "Small messages across nodes":
        # RoCE / EFA / TCPXO fabrics are described by their NIC rate and NCCL's network
        # latencies only, and the latency scales were fitted on single-node data
        "a100_oci_2node_allreduce_oke": "RoCE, small messages across nodes",
        "h100_awsp5_2node_allreduce_eks": "EFA described by its NIC rate only",
        "h100_hgx_2node_allreduce_nccltests309": "small messages across nodes",
        "h100_hgx_vm_4node_allreduce_nccltests309": "VMs, small messages across nodes",
        # GCP's tuner plugin (rules not public) and TCPXO
        "h100_gcp_a3mega_2node_allreduce": "GCP's tuner plugin, TCPXO",
        "h100_gcp_a3mega_2node_allgather_gke": "TCPXO described by its NIC rate only",
    })


def check_patterns(misses: set[str], known: dict[str, str]) -> None:
    """Every miss matches a known pattern, and every known pattern still matches a miss."""
    for m in misses:
        assert any(re.search(p, m) for p in known), f"{m} misses its goal"
    for p in known:
        assert any(re.search(p, m) for m in misses), f"{p} no longer misses: drop it"


def emulated_misses(study: str) -> tuple[int, set[str]]:
    """(emulated rows, the ids of those outside the study's band)."""
    band = float(load_figures(study)["band"].value)
    em = [r for r in rows(study, "rows.csv") if r["ours"]]
    return len(em), {r["id"] for r in em if abs(float(r["difference"])) > band}


def test_llama_rows_within_the_band() -> None:
    n, misses = emulated_misses("llama")
    assert n >= 60
    check_patterns(misses, {
        # results/llama/README.md, "Why the differences": 96 GB HBM2e H100s capped at
        # 500 W, which no preset models
        r"^torchtitan-": "other H100s",
        # the placeholder schedule the notes say the source did not run
        r"^llama3-paper-": "placeholder layouts",
        # the DP bucket messages reserve the NICs in issue order ahead of the CP ring and
        # the pipeline's messages (the what-if table): a modelling gap left visible
        r"^dgxc-v2[45]\.[0-9.]+-nemo2?-llama3\.1-405b-": "NIC calendars in issue order",
        # ours faster than MaxText's measured steps; cause not established (XLA's
        # scheduling and remat policy are mapped, not modelled)
        r"^dgxc-v2[45]\.[0-9.]+-maxtext-": "cause not established",
        # NeMo 24.01's Llama 2 rows: ours faster; cause not established
        r"^nemo-launcher-2024-02-": "cause not established",
    })


def test_moe_rows_within_the_band() -> None:
    n, misses = emulated_misses("moe")
    assert n >= 1
    check_patterns(misses, {
        # results/moe/README.md, "Why the differences": ours slower; its Megatron-FSDP
        # (ZeRO-3 at DP 128) leaves 13% of our step in exposed DP communication and its
        # DeepEP dispatch runs as NCCL's all-to-all; cause not established
        r"^modelzoo-qwen3-235b-a22b-bf16-256gpu-deepep-ep8-fsdp$": "cause not established",
    })


def test_collectives_held_out_headline() -> None:
    """The headline on data no constant was fitted on: within the targets on the held-out
    single-node sets; the multi-node ones are the known miss (the per-set reasons above)."""
    from mpiemu.studies.collectives import setups, targets_error
    lo, hi = (float(x) for x in load_figures("collectives")["targets"].value)
    held = {r["dataset"] for r in rows("collectives", "summary.csv")
            if r["calibration"] == "held out"}
    fitted = {r["dataset"] for r in rows("collectives", "summary.csv")} - held
    assert held and fitted
    multi = {s["key"] for s in setups() if s["ranks"] > 8}
    points = [{"bytes": int(r["bytes"]), "error": float(r["error"]), "setup": r["setup"]}
              for r in rows("collectives", "comparison.csv") if r["dataset"] in held]
    single = targets_error([p for p in points if p["setup"] not in multi])
    across = targets_error([p for p in points if p["setup"] in multi])
    assert single[0] <= lo and single[1] <= hi
    assert across[0] > lo or across[1] > hi       # known miss: drop this line once it holds

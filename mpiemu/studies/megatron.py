"""`mpiemu report megatron`: emulated Megatron-LM training beside published measurements on
DGX A100 clusters (Korthikanti et al. 2022 Tables 4 and 5), every run timing only.

* `layers.csv`: forward + backward time of one GPT 22B layer at TP = 8 (Table 4): no
  recompute, SP, full and selective recompute, selective + SP; two-layer runs of
  `workloads/megatron-22b-tp8.toml`, layer 1's span in rank 0's trace (forward, and backward
  with its recomputation);
* `iterations.csv`: iteration time and MFU / HFU (Table 5) of GPT 22B (8 GPUs), GPT-3 175B
  (TP 8 x PP 8, interleaved x3: 64 GPUs) and MT-NLG 530B (TP 8 x PP 35, interleaved x3: 280
  GPUs), full recompute and selective + SP, each folded to one process per stage
  (`run.fold`, exact);
* README.md: ours beside theirs with the difference, the rows not emulated and why.
Nothing is fitted: the device (`a100-sxm4-80gb`) and network (`dgx-a100`) presets are the
ones every other study uses. Golden test: the first and last layer rows (8 ranks, 2 layers).
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from . import runs as launch
from ..workloads import DIR as WORKLOADS_DIR
from .common import Golden, Row, load_figures, read_csv

WORKLOADS = WORKLOADS_DIR          # the bundled workloads
MEASURED = Path(__file__).with_name("megatron_measured.csv")


def measured(dataset: str, model: str | None = None) -> list[dict[str, str]]:
    """Published rows of one dataset (and model), in file order."""
    return [r for r in read_csv(MEASURED)
            if r["dataset"] == dataset and (model is None or r["model"] == model)]


def _sets(sp: bool, recompute: str) -> list[str]:
    return [f"parallel.sequence_parallel={str(sp).lower()}", f"train.recompute='{recompute}'"]


class LayerSpans(NamedTuple):
    """One layer's passes on rank 0 (seconds)."""

    forward: float
    backward: float                 # recomputation included
    grad_acc: float                 # its gradients added into Megatron's buffer (hooks)


def layer_spans_s(run_dir: Path, layer: int) -> LayerSpans:
    """Forward span, backward span and gradient-buffer hook time of one layer, rank 0."""
    from ..analysis import load  # noqa: PLC0415
    rt = load(run_dir).ranks[0]
    ev = rt.events
    mine = ev["layer"] == layer
    fwd, bwd = (mine & np.isin(rt.phases, phases)
                for phases in (("fwd",), ("bwd", "recompute")))
    hooks = mine & np.char.endswith(rt.names.astype(str), ".grad_acc")
    return LayerSpans(float(ev["t_end"][fwd].max() - ev["t_start"][fwd].min()),
                      float(ev["t_end"][bwd].max() - ev["t_start"][bwd].min()),
                      _summed_s(rt, hooks))


def layer_rows(runs: Path, labels: tuple[str, ...] = (), reuse: bool = False) -> list[Row]:
    """Table 4: one 22B layer per technique (two-layer runs; layer 1 measured)."""
    fig = load_figures("megatron")
    pub = measured("korthikanti2022_table4_layer")
    rows: list[Row] = []
    for cfg, theirs in zip(fig["layer_runs"].value, pub):
        if labels and cfg["label"] not in labels:
            continue
        out = runs / cfg["label"].replace(" ", "_").replace(":", "").replace("+", "and")
        _launch(8, "megatron-22b-tp8.toml", _sets(cfg["sp"], cfg["recompute"]) +
                ["model.layers=2"], out, reuse)
        fwd, bwd, hooks = layer_spans_s(out, 1)
        ours, ref = fwd + bwd, float(theirs["iteration_s"])
        rows.append({"run": cfg["label"], "sp": cfg["sp"], "recompute": cfg["recompute"],
                     "measured_ms": ref * 1e3, "ours_ms": ours * 1e3,
                     "difference": ours / ref - 1.0,
                     "measured_forward_ms": cfg["forward_ms"], "ours_forward_ms": fwd * 1e3,
                     "measured_backward_ms": cfg["backward_ms"], "ours_backward_ms": bwd * 1e3,
                     "ours_grad_acc_ms": hooks * 1e3})
    return rows


def iteration_rows(runs: Path, labels: tuple[str, ...] = (), reuse: bool = False
                   ) -> list[Row]:
    """Table 5: iteration time (rank 0's trace), MFU and HFU (`training.flops`, Megatron's counts)
    and stage 0's bubble of whole-model runs."""
    from ..analysis import load  # noqa: PLC0415
    from ..analysis.breakdown import iteration_breakdown  # noqa: PLC0415
    fig = load_figures("megatron")
    rows: list[Row] = []
    for cfg in fig["iteration_runs"].value:
        if labels and cfg["label"] not in labels:
            continue
        theirs = measured(cfg["dataset"], cfg["model"])[0]
        out = runs / cfg["label"].replace(" ", "_").replace("+", "and")
        _launch(cfg["ranks"], f"{cfg['workload']}.toml", _sets(cfg["sp"], cfg["recompute"]),
                out, reuse)
        rt = load(out).ranks[0]
        stage0 = iteration_breakdown(rt, 0, sync_is_idle=True)
        summary: dict[str, Any] = json.loads((out / "manifest.json").read_text())["summary"]
        ours, ref = stage0.iteration_s, float(theirs["iteration_s"])
        mfu, hfu = _utilization(cfg, ours)
        ce, scale = (_summed_s(rt, np.char.startswith(rt.names.astype(str), prefix))
                     for prefix in ("head.ce.", "dp.grad_scale"))
        rows.append({"run": cfg["label"], "gpus": cfg["ranks"], "sp": cfg["sp"],
                     "recompute": cfg["recompute"], "measured_s": ref, "ours_s": ours,
                     "difference": ours / ref - 1.0,
                     "measured_mfu": _num(theirs["mfu"]), "ours_mfu": mfu,
                     "measured_hfu": _num(theirs["hfu"]), "ours_hfu": hfu,
                     "bubble_fraction_stage0": stage0.idle_s / stage0.iteration_s,
                     "memory_GiB_stage0": summary["memory"]["total_bytes"] / 2**30,
                     "ours_ce_ms_rank0": ce * 1e3, "ours_grad_scale_ms_rank0": scale * 1e3})
    return rows


def _summed_s(rt: Any, mask: np.ndarray) -> float:
    """Summed duration of a rank's events selected by `mask`."""
    ev = rt.events
    return float((ev["t_end"][mask] - ev["t_start"][mask]).sum())


def _utilization(cfg: dict[str, Any], iteration_s: float) -> tuple[float, float]:
    """(MFU, HFU) of one iteration run's configuration at this iteration time."""
    from ..training.flops import hardware_flops, model_flops, utilization  # noqa: PLC0415
    from ..config.workload import load_workload, resolve_device  # noqa: PLC0415
    from ..runner.train_setup import resolve  # noqa: PLC0415
    w = load_workload(WORKLOADS / f"{cfg['workload']}.toml", _sets(cfg["sp"], cfg["recompute"]))
    model, gb, _ = resolve(w)
    peak = resolve_device(w).peak(w.run.emulated_dtype)
    return (utilization(model_flops(model, gb), iteration_s, cfg["ranks"], peak),
            utilization(hardware_flops(model, gb, cfg["recompute"]), iteration_s,
                        cfg["ranks"], peak))


def _launch(ranks: int, workload: str, sets: list[str], out: Path, reuse: bool) -> None:
    """Run it on `ranks` emulated GPUs (folded: one process per pipeline stage, where that
    is exact), unless `reuse` and a complete run is already there (same sets: the caller's
    promise, as `--reuse` says)."""
    manifest = out / "manifest.json"
    if reuse and manifest.exists() and json.loads(manifest.read_text()).get("status") == \
            "complete":
        return
    wl = WORKLOADS / workload
    launch.run(launch.processes(wl, sets, ranks), wl, sets, out, timeout=3000)


def _num(cell: str) -> float | None:
    return float(cell) if cell else None


def golden() -> list[Golden]:
    """The first and last Table 4 rows (two 8-rank, two-layer runs)."""
    fig = load_figures("megatron")
    keep = (fig["layer_runs"].value[0]["label"], fig["layer_runs"].value[-1]["label"])
    with tempfile.TemporaryDirectory(prefix="mpiemu-megatron-") as tmp:
        rows = layer_rows(Path(tmp), keep)
    return [Golden("layers.csv", rows, lambda r: r["run"] in keep)]

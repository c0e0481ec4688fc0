"""`mpiemu report moe`: published, measured BF16 and FP8 pre-training of Mixture-of-Experts
models on H100 GPUs (`moe_measured.toml`) beside the same configurations emulated, timing
only (an FP8 row with its `[fp8]` recipe, `moe.toml [fp8_recipes]`).

Each `[[run]]` row becomes one `mpiemu run` of its own layout, every parameter taken from the
row: model preset, TP, PP, CP, interleaved virtual stages, DP, EP, ETP, global batch, micro-batch,
sequence length, recomputation, the capacity factor, sequence parallelism (required with TP),
with what its notes add (`moe.toml [note_rules]`, `[layout_overrides]`). Tokens per expert are
in perfect balance (`moe.tokens = 'balanced'`, what forced-balance benchmarks run; each row
says what its source used). An FSDP row runs ZeRO-3 (the experts sharded over expert DP).
A run of more GPUs than stages folds (`run.fold`) where that
is exact; a row is listed, not run, with its reason when its model has no preset, when the
emulator refuses its layout, or when it needs more processes than `[max_processes]`.

* `rows.csv`: every BF16 row: measured and ours in the row's metric (step time, tokens/s per
  GPU or model TFLOP/s per GPU in its source's count), the difference ours / theirs - 1,
  tokens/s per GPU both ways, MFU (ours by `training.flops.model_flops`, and in the source's
  count where it states one), rank 0's breakdown, memory, what the emulation changes, or why
  the row was not emulated;
* `fp8.csv`: every FP8 row, the same columns;
* `runs.csv`: each emulated run's MPI processes and wall seconds (not golden-checked).
Golden test: the Qwen3-30B-A3B row (8 GPUs, EP 8: one folded process).
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from .common import Golden, Row
from .measured_rows import Plan, emulate
from .moe_rows import (convention, emulated_with, fig, flops_per_token, fp8_recipe,
                       fp8_rows, framework, has_preset, measured, measured_mfu,
                       measured_tokens, not_expressed, overrides, routing_label, set_value,
                       write_workload)
def plan(row: dict[str, Any], workload: Path) -> Plan:
    """The row's reason not to run first; else validate its layout as the run would, then
    fold it where that is exact."""
    sets = overrides(row)
    first = not_expressed(row)
    if first and not has_preset(str(row["model"])):
        return Plan(row, sets, 0, first)
    if not first:
        return _plan_layout(row, sets, workload)
    try:
        layout = _plan_layout(row, sets, workload)
    except Exception as exc:      # noqa: BLE001 - a row not run anyway: say how its check ends
        return Plan(row, sets, 0, f"{first}; validating its layout stops at "
                                  f"{type(exc).__name__}: {exc}")
    extra = f"; the emulator would also refuse the layout ({layout.reason})" \
        if layout.reason else ""
    return layout._replace(reason=first + extra)


def _plan_layout(row: dict[str, Any], sets: list[str], workload: Path) -> Plan:
    from ..config.errors import ConfigError  # noqa: PLC0415
    from ..config.workload import load_workload  # noqa: PLC0415
    from .runs import fold_processes  # noqa: PLC0415
    from ..runner.train_setup import validate  # noqa: PLC0415
    gpus = int(row["gpus"])
    try:
        w = load_workload(str(workload), sets)
        validate(w, gpus)
    except ConfigError as exc:
        return Plan(row, sets, 0, f"the emulator refuses the layout: {exc}")
    procs, why = fold_processes(w, gpus)
    why = why and f"; it does not fold ({why})"
    limit = int(fig("max_processes").value)
    if procs > limit:
        return Plan(row, sets, procs, f"{gpus} GPUs need {procs} MPI processes, more than "
                                      f"this study's {limit}{why}")
    return Plan(row, sets, procs, "")


def row_of(p: Plan, workload: Path, summary: dict[str, Any] | None, shared: str) -> Row:
    """One CSV row: the measurement, ours beside it (None when not emulated)."""
    r = p.row
    gpus, tokens = int(r["gpus"]), int(r["global_batch"]) * int(r["seq_len"])
    theirs_tok = measured_tokens(r, workload)
    conv = convention(r)
    out: Row = {"id": r["id"], "framework": framework(r), "model": r["model"], "gpus": gpus,
                "tp": r["tp"], "pp": r["pp"], "cp": r["cp"], "vp": r["vp"], "dp": r["dp"],
                "ep": r["ep"], "etp": r["etp"], "global_batch": r["global_batch"],
                "micro_batch": r["micro_batch"], "seq_len": r["seq_len"],
                "source_recompute": r["recompute"],
                "recompute": set_value(p.sets, "train.recompute").strip("'"),
                "source_sharding": r["sharding"], "zero": int(set_value(p.sets, "optimizer.zero")),
                "sequence_parallel": "parallel.sequence_parallel=true" in p.sets,
                "dispatcher": r["dispatcher"], "routing": routing_label(r),
                "fp8_recipe": fp8_recipe(r),
                "tokens": fig("tokens").value, "metric": r["metric"], "measured": float(r["value"]),
                "ours": None, "difference": None, "measured_tokens_per_s_per_gpu": theirs_tok,
                "ours_tokens_per_s_per_gpu": None, "tokens_difference": None,
                "measured_step_s": tokens / (theirs_tok * gpus), "ours_step_s": None,
                "measured_mfu": measured_mfu(r), "ours_mfu": None, "ours_mfu_their_count": None,
                "ours_compute_s": None, "ours_tp_ep_exposed_s": None, "ours_dp_exposed_s": None,
                "ours_idle_s": None, "memory_GiB": None, "fits": None, "shared_run": shared,
                "emulated_with": "", "not_emulated": p.reason}
    if summary is None:
        return out
    it = summary["iterations"][0]
    step = float(it["t_end"] - it["t_start"])
    ours_tok = tokens / (step * gpus)
    if r["metric"] == "step_time_s":
        ours = step
    elif r["metric"] == "tokens_per_s_per_gpu":
        ours = ours_tok
    else:                                       # model TFLOP/s per GPU, in their count
        assert conv is not None, f"{r['id']}: model TFLOP/s without a FLOP convention"
        ours = ours_tok * flops_per_token(r, workload, conv["name"]) / 1e12
    idle = step - it["compute_s"] - it["tp_exposed_s"] - it["dp_exposed_s"]
    out.update({"ours": ours, "difference": ours / float(r["value"]) - 1.0,
                "ours_tokens_per_s_per_gpu": ours_tok,
                "tokens_difference": ours_tok / theirs_tok - 1.0, "ours_step_s": step,
                "ours_mfu": float(it["mfu"]), "ours_compute_s": float(it["compute_s"]),
                "ours_tp_ep_exposed_s": float(it["tp_exposed_s"]),
                "ours_dp_exposed_s": float(it["dp_exposed_s"]), "ours_idle_s": idle,
                "memory_GiB": summary["memory"]["total_bytes"] / 2**30,
                "fits": bool(summary["memory"]["fits"]),
                "emulated_with": "; ".join(emulated_with(r, p.sets))})
    if conv is not None:
        out["ours_mfu_their_count"] = (ours_tok * flops_per_token(r, workload, conv["name"])
                                       / (float(conv["peak_tflops"]) * 1e12))
    return out


def study_rows(runs: Path, ids: tuple[str, ...] = (), reuse: bool = False, fp8: bool = False
               ) -> tuple[list[Row], list[Row]]:
    """(rows.csv, runs.csv) rows for every BF16 row, or every FP8 row (`fp8`), or those of
    `ids`: each distinct layout emulated once, in its folded form where that is exact."""
    workload = write_workload(runs)
    table = fp8_rows() if fp8 else measured()
    return emulate([r for r in table if not ids or r["id"] in ids],
                   lambda r: (str(r["gpus"]), str(r["model"]), str(r["etp"]), *overrides(r)),
                   lambda r: plan(r, workload),
                   lambda p, summary, first: row_of(p, workload, summary, first), runs,
                   workload, int(fig("max_processes").value), 1800, reuse)


def flop_checks(workload: Path) -> list[Row]:
    """Each source's FLOP count reproduced: rows that print model TFLOP/s beside a step time
    or tokens/s, their TFLOP/s recomputed from the latter with `[flop_conventions]`."""
    out: list[Row] = []
    for r in measured():
        conv = convention(r)
        other = r["other_metrics"]
        printed = r["value"] if r["metric"] == "model_tflops_per_gpu" else \
            other.get("model_tflops_per_gpu")
        if conv is None or printed is None or r["metric"] == "model_tflops_per_gpu":
            continue
        tok = measured_tokens(r, workload)
        ours = tok * flops_per_token(r, workload, conv["name"]) / 1e12
        out.append({"id": r["id"], "convention": conv["name"], "printed_tflops": float(printed),
                    "from_their_throughput": ours, "difference": ours / float(printed) - 1.0})
    return out


def golden() -> list[Golden]:
    """The first emulated row: Qwen3-30B-A3B on 8 GPUs, EP 8 x DP 8 (one folded process)."""
    first = next(r["id"] for r in measured() if r["model"] == "qwen3-30b-a3b")
    with tempfile.TemporaryDirectory(prefix="mpiemu-moe-") as tmp:
        rows, _ = study_rows(Path(tmp), (first,))
    return [Golden("rows.csv", rows, lambda r: r["id"] == first)]

"""`mpiemu report llama`: published, measured BF16 pre-training of Llama-family models on
H100 GPUs (`llama_measured.toml`) beside the same configurations emulated, timing only.

Each `[[run]]` row becomes one `mpiemu run` of its own layout, every parameter taken from
the row: model preset, TP, PP, CP, interleaved virtual stages, DP, global batch, micro-batch,
sequence length, recomputation, sequence parallelism (`llama.toml [sequence_parallel]`),
flash attention, and its sharding (the distributed optimizer as ZeRO-1, FSDP as ZeRO-3),
with what the row's notes add (`[note_rules]`, `[model_overrides]`). A run of more GPUs than
CP ranks x stages folds (`run.fold`: one process per CP rank of each stage, exact) where
that is exact; a row that needs more processes than `[max_processes]`, or whose layout the
emulator refuses, is listed with the reason the code gives, not run. Rows of one layout
(the same configuration published twice, or eager and compiled runs) share one run.

* `rows.csv`: every BF16 row: measured and ours in the row's metric (step time, tokens/s per
  GPU or model TFLOP/s per GPU in its source's count), the difference ours / theirs - 1,
  tokens/s per GPU both ways, MFU (ours by `training.flops.model_flops`, and in the source's
  count where it states one), rank 0's breakdown, memory, or why it was not emulated;
* `runs.csv`: each emulated run's MPI processes and wall seconds (not golden-checked);
* `fp8.csv`: each `[[fp8_run]]` row whose BF16 twin (the same configuration) was emulated,
  that layout run again with the row's `[fp8]` recipe (`[fp8_recipes]`): the published
  FP8 / BF16 speedup beside ours.
Golden test: the first row (Llama 3.1 8B, 8 GPUs, CP 2: two folded processes, ~2 s).
"""
from __future__ import annotations

import json
import re
import tempfile
import tomllib
from pathlib import Path
from typing import Any

from .common import Golden, Row, load_figures
from .measured_rows import Plan, by_prefix, emulate, fp8_recipe_rule, last_wins, run
from .measured_rows import measured_tokens as tokens_per_gpu

MEASURED = Path(__file__).with_name("llama_measured.toml")
WORKLOAD = """name = "llama"

[run]
kind = "train"
iterations = 1
numerics = "off"
emulated_dtype = "{dtype}"

[device]
preset = "{device}"

[model]
attention = "flash"

[train]
memory_check = "warn"

[optimizer]
name = "adam"
"""


def measured() -> list[dict[str, Any]]:
    """The BF16 rows of llama_measured.toml, in file order."""
    dtype = str(load_figures("llama")["emulated_dtype"].value)
    return [r for r in tomllib.loads(MEASURED.read_text())["run"] if r["precision"] == dtype]


def fp8_measured() -> list[dict[str, Any]]:
    """The FP8 rows of llama_measured.toml, in file order."""
    return list(tomllib.loads(MEASURED.read_text()).get("fp8_run", []))


def bf16_twin(fp8_id: str) -> str:
    """The id of an FP8 row's BF16 row of the same configuration (there may be none)."""
    return fp8_id.replace("fp8", "bf16")


def framework(row: dict[str, Any]) -> str:
    """The row's framework, short: its name before the parenthesis."""
    return str(row["framework"]).split(" (")[0]


def _by_prefix(table: str, row: dict[str, Any]) -> list[dict[str, Any]]:
    return by_prefix("llama", table, row)


def zero_stage(row: dict[str, Any]) -> int:
    """The ZeRO stage of the row's sharding (`llama.toml [sharding]`)."""
    for e in load_figures("llama")["sharding"].value:
        if str(row["sharding"]).startswith(e["starts"]):
            return int(e["zero"])
    raise ValueError(f"{row['id']}: sharding {row['sharding']!r} has no rule in llama.toml")


def overrides(row: dict[str, Any]) -> list[str]:
    """`--set` items that emulate one measured row (every value from the row or its notes)."""
    fig = load_figures("llama")
    zero, tp, vp = zero_stage(row), int(row["tp"]), int(row["vp"])
    sp = str(fig["sequence_parallel"].value) == "tp > 1" and tp > 1
    sets = [f"model.preset='{row['model']}'", f"model.seq_len={row['seq_len']}",
            f"parallel.tp={tp}", f"parallel.pp={row['pp']}", f"parallel.cp={row['cp']}",
            f"parallel.dp={row['dp']}", f"parallel.sequence_parallel={str(sp).lower()}",
            f"train.global_batch={row['global_batch']}", f"train.micro_batch={row['micro_batch']}",
            f"train.recompute='{row['recompute']}'", f"optimizer.zero={zero}"]
    if vp > 1:
        sets += ["parallel.schedule='interleaved'", f"parallel.virtual_stages={vp}"]
    layers = _layers(str(row["model"]))
    pv = int(row["pp"]) * vp
    if layers % pv and (layers + 2) % pv == 0:
        sets += list(fig["uneven_split"].value)
    hybrid = re.search(str(fig["hybrid_sharding"].value), str(row["sharding"]))
    if hybrid and int(hybrid.group(2)) > 1:
        sets.append(f"optimizer.shard_group={hybrid.group(1)}")
    for rule in fig["note_rules"].value:
        if rule["phrase"] in f"{row['notes']} {row['framework']}" and rule["zero"] in (-1, zero):
            sets += list(rule["sets"])
    for e in _by_prefix("model_overrides", row):
        sets += list(e["sets"])
    return last_wins(sets)


def _layers(preset: str) -> int:
    from ..model.presets import load_model_preset  # noqa: PLC0415
    return load_model_preset(preset).config.layers


def write_workload(where: Path) -> Path:
    """The study's base workload (device and dtype from llama.toml) under `where`."""
    fig = load_figures("llama")
    where.mkdir(parents=True, exist_ok=True)
    path = where / "llama.toml"
    path.write_text(WORKLOAD.format(dtype=fig["emulated_dtype"].value, device=fig["device"].value))
    return path


def plan(row: dict[str, Any], workload: Path) -> Plan:
    """Validate the row's layout as the run would, then fold it where that is exact."""
    from ..config.errors import ConfigError  # noqa: PLC0415
    from ..config.workload import load_workload  # noqa: PLC0415
    from .runs import fold_processes  # noqa: PLC0415
    from ..runner.train_setup import validate  # noqa: PLC0415
    sets, gpus = overrides(row), int(row["gpus"])
    try:
        w = load_workload(str(workload), sets)
        validate(w, gpus)
    except ConfigError as exc:
        return Plan(row, sets, 0, f"the emulator refuses the layout: {exc}")
    procs, why = fold_processes(w, gpus)
    why = why and f"; it does not fold ({why})"
    limit = int(load_figures("llama")["max_processes"].value)
    if procs > limit:
        return Plan(row, sets, procs, f"{gpus} GPUs need {procs} MPI processes, more than "
                                      f"this study's {limit}{why}")
    return Plan(row, sets, procs, "")


def flops_per_token(row: dict[str, Any], workload: Path, convention: str) -> float:
    """Model FLOPs per token of the row's model in a source's count (`[flop_conventions]`):
    'ours' (`training.flops.model_flops`, the vocabulary padded), 'dgxc', 'korthikanti'
    (Appendix A: f = 4h, multi-head) or 'torchtitan' (6 (N - embedding) + 12 L h s)."""
    from ..config.workload import load_workload  # noqa: PLC0415
    from ..runner.train_setup import resolve  # noqa: PLC0415
    from ..training.flops import model_flops  # noqa: PLC0415
    cfg, _, _ = resolve(load_workload(str(workload), overrides(row)))
    L, h, f, s, V = cfg.layers, cfg.hidden, cfg.ffn_hidden, cfg.seq_len, cfg.vocab
    if convention == "ours":
        return model_flops(cfg, 1) / s
    if convention == "dgxc":
        return (12 * L * h * h * (1 + cfg.groups / cfg.heads + s / h) + 18 * L * f * h
                + 6 * V * h)
    if convention == "korthikanti":
        return 72 * L * h * h * (1 + s / (6 * h) + V / (12 * h * L))
    if convention == "torchtitan":
        return 6 * (cfg.param_count() - cfg.padded_vocab * h) + 12 * L * h * s
    raise ValueError(f"flop convention {convention!r}")


def _zero_of(sets: list[str]) -> int:
    """The ZeRO stage the overrides set (the sharding's, or a note's)."""
    return int(next(s for s in reversed(sets) if s.startswith("optimizer.zero=")).split("=")[1])


def _convention(row: dict[str, Any]) -> dict[str, Any] | None:
    found = _by_prefix("flop_conventions", row)
    return found[0] if found else None


def measured_tokens(row: dict[str, Any], workload: Path) -> float:
    """The row's tokens/s per GPU (`measured_rows.measured_tokens`, in this study's FLOP
    counts)."""
    return tokens_per_gpu(row, _convention, lambda name: flops_per_token(row, workload, name))


def measured_step(row: dict[str, Any], workload: Path) -> float:
    """The row's step time, seconds (from its metric, whichever it is)."""
    tokens = int(row["global_batch"]) * int(row["seq_len"])
    return tokens / (measured_tokens(row, workload) * int(row["gpus"]))


def row_of(p: Plan, workload: Path, summary: dict[str, Any] | None, shared: str) -> Row:
    """One CSV row: the measurement, ours beside it (None when not emulated)."""
    r = p.row
    gpus, tokens = int(r["gpus"]), int(r["global_batch"]) * int(r["seq_len"])
    theirs_tok = measured_tokens(r, workload)
    conv = _convention(r)
    out: Row = {"id": r["id"], "framework": framework(r), "model": r["model"], "gpus": gpus,
                "tp": r["tp"], "pp": r["pp"], "cp": r["cp"], "vp": r["vp"], "dp": r["dp"],
                "global_batch": r["global_batch"], "micro_batch": r["micro_batch"],
                "seq_len": r["seq_len"], "recompute": r["recompute"], "zero": _zero_of(p.sets),
                "sequence_parallel": "parallel.sequence_parallel=true" in p.sets,
                "metric": r["metric"], "measured": float(r["value"]), "ours": None,
                "difference": None, "measured_tokens_per_s_per_gpu": theirs_tok,
                "ours_tokens_per_s_per_gpu": None, "tokens_difference": None,
                "measured_step_s": tokens / (theirs_tok * gpus), "ours_step_s": None,
                "measured_mfu": r["other_metrics"].get("mfu"), "ours_mfu": None,
                "ours_mfu_their_count": None, "ours_compute_s": None,
                "ours_tp_exposed_s": None, "ours_dp_exposed_s": None, "ours_idle_s": None,
                "memory_GiB": None, "fits": None, "shared_run": shared,
                "placeholders": str(load_figures("llama")["placeholder"].value) in r["notes"],
                "not_emulated": p.reason}
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
                "ours_tp_exposed_s": float(it["tp_exposed_s"]),
                "ours_dp_exposed_s": float(it["dp_exposed_s"]), "ours_idle_s": idle,
                "memory_GiB": summary["memory"]["total_bytes"] / 2**30,
                "fits": bool(summary["memory"]["fits"])})
    if out["measured_mfu"] is not None and conv is not None:
        out["ours_mfu_their_count"] = (ours_tok * flops_per_token(r, workload, conv["name"])
                                       / (conv["peak_tflops"] * 1e12))
    return out


def study_rows(runs: Path, ids: tuple[str, ...] = (), reuse: bool = False
               ) -> tuple[list[Row], list[Row]]:
    """(rows.csv, runs.csv) rows for every BF16 row (or those of `ids`): each distinct
    layout emulated once, in its folded form where that is exact."""
    workload = write_workload(runs)
    return emulate([r for r in measured() if not ids or r["id"] in ids],
                   lambda r: (str(r["gpus"]), *overrides(r)), lambda r: plan(r, workload),
                   lambda p, summary, first: row_of(p, workload, summary, first), runs,
                   workload, int(load_figures("llama")["max_processes"].value), 3000, reuse)


def what_if_rows(runs: Path, rows: list[Row], reuse: bool = False) -> list[Row]:
    """`llama.toml [what_if]`: an emulated row run again with one setting changed (a
    diagnostic of where its time goes, beside the row's own run)."""
    workload = write_workload(runs)
    base = {r["id"]: r for r in rows if r["ours"] is not None}
    meas = {r["id"]: r for r in measured()}
    out: list[Row] = []
    for d in load_figures("llama")["what_if"].value:
        if d["row"] not in base:
            continue
        p = plan(meas[d["row"]], workload)
        p = p._replace(sets=last_wins(p.sets + list(d["sets"])))
        where = runs / f"what-if-{d['row']}"
        run(p, workload, where, reuse, 3000)
        it = json.loads((where / "manifest.json").read_text())["summary"]["iterations"][0]
        step, b = float(it["t_end"] - it["t_start"]), base[d["row"]]
        idle = step - it["compute_s"] - it["tp_exposed_s"] - it["dp_exposed_s"]
        out.append({"row": d["row"], "what_if": d["label"], "sets": " ".join(d["sets"]),
                    "measured_step_s": b["measured_step_s"], "ours_step_s": b["ours_step_s"],
                    "what_if_step_s": step, "ours_idle_s": b["ours_idle_s"],
                    "what_if_idle_s": idle, "ours_dp_exposed_s": b["ours_dp_exposed_s"],
                    "what_if_dp_exposed_s": float(it["dp_exposed_s"])})
    return out


def fp8_recipe(row: dict[str, Any]) -> str:
    """The row's FP8 recipe (`llama.toml [fp8_recipes]`)."""
    return fp8_recipe_rule("llama", row)


def fp8_sets(row: dict[str, Any], sets: list[str], recipe: str) -> list[str]:
    """What an FP8 row adds to its BF16 twin's overrides `sets`: the recipe, and FP8
    parameters where its notes state them and the twin runs the distributed optimizer
    (`llama.toml [fp8_params]`)."""
    out = [f"fp8.recipe='{recipe}'"]
    if str(load_figures("llama")["fp8_params"].value) in str(row["notes"]) and \
            _zero_of(sets) >= 1:
        out.append("optimizer.fp8_param_gather=true")
    return out


def fp8_rows(runs: Path, rows: list[Row], reuse: bool = False) -> list[Row]:
    """Each [[fp8_run]] whose BF16 twin (its id with bf16 for fp8) was emulated: that run
    again with the row's FP8 recipe, the measured FP8 / BF16 speedup beside ours (a twin
    missing or not emulated: listed with why)."""
    workload = write_workload(runs)
    base = {r["id"]: r for r in rows}
    meas = {r["id"]: r for r in measured()}
    out: list[Row] = []
    done: dict[tuple[str, ...], float] = {}     # one run per layout (rows published twice)
    for f in fp8_measured():
        twin, gpus = bf16_twin(str(f["id"])), int(f["gpus"])
        row: Row = {"id": f["id"], "bf16_twin": twin, "framework": framework(f),
                    "model": f["model"], "gpus": gpus, "recipe": fp8_recipe(f),
                    "measured_bf16_step_s": None,
                    "measured_fp8_step_s": measured_step(f, workload),
                    "measured_speedup": None, "ours_bf16_step_s": None,
                    "ours_fp8_step_s": None, "ours_speedup": None, "difference": None,
                    "not_emulated": ""}
        b = base.get(twin)
        if b is None or b["ours"] is None:
            row["not_emulated"] = ("no BF16 row of the same configuration" if b is None
                                   else f"its BF16 twin is not emulated: {b['not_emulated']}")
            out.append(row)
            continue
        p = plan(meas[twin], workload)
        extra = fp8_sets(f, p.sets, str(row["recipe"]))
        if "optimizer.fp8_param_gather=true" in extra:
            row["recipe"] += " + FP8 params"
        p = p._replace(sets=last_wins(p.sets + extra))
        key = (str(gpus), *p.sets)
        if key not in done:
            where = runs / f"fp8-{f['id']}"
            run(p, workload, where, reuse, 3000)
            it = json.loads((where / "manifest.json").read_text())["summary"]["iterations"][0]
            done[key] = float(it["t_end"] - it["t_start"])
        ours = done[key]
        theirs = b["measured_step_s"] / row["measured_fp8_step_s"]
        row.update({"measured_bf16_step_s": b["measured_step_s"], "measured_speedup": theirs,
                    "ours_bf16_step_s": b["ours_step_s"], "ours_fp8_step_s": ours,
                    "ours_speedup": b["ours_step_s"] / ours})
        row["difference"] = row["ours_speedup"] / theirs - 1.0
        out.append(row)
    return out


def golden() -> list[Golden]:
    """The first row: Llama 3.1 8B on 8 GPUs, TP 1 x CP 2 x DP 4 (two folded processes)."""
    first = measured()[0]["id"]
    with tempfile.TemporaryDirectory(prefix="mpiemu-llama-") as tmp:
        rows, _ = study_rows(Path(tmp), (first,))
    return [Golden("rows.csv", rows, lambda r: r["id"] == first)]

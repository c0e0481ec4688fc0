"""What the studies of published measured runs share (`llama`, `moe`): every row planned,
each distinct layout emulated once (folded where exact), rows of one layout sharing its run,
a run that folding stops at its first inexact call run again unfolded where the study can
afford one process per GPU."""
from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any, Callable, Iterable, NamedTuple

from . import runs as launch
from .common import Row, load_figures


def by_prefix(study: str, table: str, row: dict[str, Any]) -> list[dict[str, Any]]:
    """The rules of `study`.toml [table] whose `prefix` starts the row's id, in order."""
    return [e for e in load_figures(study)[table].value if row["id"].startswith(e["prefix"])]


def fp8_recipe_rule(study: str, row: dict[str, Any]) -> str:
    """An FP8 row's recipe: the first `study`.toml [fp8_recipes] rule matching its id."""
    for e in by_prefix(study, "fp8_recipes", row):
        return str(e["recipe"])
    raise ValueError(f"{row['id']}: no FP8 recipe rule in {study}.toml [fp8_recipes]")


class Plan(NamedTuple):
    """How one row is emulated: its overrides, MPI processes, or why it is not run."""

    row: dict[str, Any]
    sets: list[str]
    processes: int
    reason: str                      # "" when it is emulated


def measured_tokens(row: dict[str, Any],
                    convention: Callable[[dict[str, Any]], dict[str, Any] | None],
                    per_token: Callable[[str], float]) -> float:
    """A measured row's tokens/s per GPU: stated, from its step time, or from its model
    TFLOP/s in its source's FLOP count (`convention(row)` names it, `per_token(name)` is
    the model's FLOPs per token in that count)."""
    tokens = int(row["global_batch"]) * int(row["seq_len"]) / int(row["gpus"])
    metric, value = row["metric"], float(row["value"])
    if metric == "step_time_s":
        return tokens / value
    if metric == "tokens_per_s_per_gpu":
        return value
    if metric == "model_tflops_per_gpu":
        conv = convention(row)
        assert conv is not None, f"{row['id']}: model TFLOP/s without a FLOP convention"
        return value * 1e12 / per_token(conv["name"])
    raise ValueError(f"{row['id']}: metric {metric!r}")


def last_wins(sets: list[str]) -> list[str]:
    """One item per key, the last one given, in first-seen order."""
    last = {s.split("=")[0]: s for s in sets}
    return list(dict.fromkeys(last[s.split("=")[0]] for s in sets))


def emulate(rows: Iterable[dict[str, Any]], key: Callable[[dict[str, Any]], tuple[str, ...]],
            plan: Callable[[dict[str, Any]], Plan],
            row_of: Callable[[Plan, dict[str, Any] | None, str], Row], runs: Path,
            workload: Path, limit: int, timeout: int, reuse: bool = False
            ) -> tuple[list[Row], list[Row]]:
    """(rows.csv, runs.csv) rows: each row planned once per `key` (planning a 2048-GPU fold
    takes seconds), each emulated layout run once, the rows of one layout sharing its run
    (`row_of(plan, summary or None, the first row's id)`)."""
    done: dict[tuple[str, ...], tuple[str, dict[str, Any]]] = {}
    planned: dict[tuple[str, ...], Plan] = {}
    out: list[Row] = []
    log: list[Row] = []
    for r in rows:
        k = key(r)
        if k not in planned:
            planned[k] = plan(r)
        p = planned[k]._replace(row=r)
        if p.reason:
            out.append(row_of(p, None, ""))
            continue
        if k not in done:
            where = runs / r["id"]
            t0 = time.perf_counter()
            try:
                ran = run(p, workload, where, reuse, timeout)
            except RuntimeError as exc:
                planned[k] = fold_failed(p, exc, limit)
                if planned[k].reason:
                    out.append(row_of(planned[k], None, ""))
                    continue
                p = planned[k]
                ran = run(p, workload, where, reuse, timeout)
            log.append({"run": r["id"], "gpus": r["gpus"], "processes": p.processes,
                        "wall_s": time.perf_counter() - t0 if ran else None,
                        "sets": " ".join(p.sets)})
            done[k] = (r["id"], json.loads((where / "manifest.json").read_text())["summary"])
        first, summary = done[k]
        out.append(row_of(p, summary, first))
    return out, log


def fold_failed(p: Plan, exc: RuntimeError, limit: int) -> Plan:
    """A folded run that folding stopped at its first inexact call (`FoldError`): unfolded
    if the study can afford one process per GPU (`limit`), else not emulated, saying why."""
    found = re.search(r"FoldError: run\.fold: (.*?)(?:, so folding| \(traceback|$)", str(exc))
    if found is None or p.processes >= int(p.row["gpus"]):
        raise exc
    gpus = int(p.row["gpus"])
    if gpus <= limit:
        return p._replace(processes=gpus)
    return p._replace(reason=f"{gpus} GPUs need {gpus} MPI processes unfolded, more than this "
                             f"study's {limit}; folded, the run stops at its first inexact call "
                             f"({found.group(1)})")


def run(p: Plan, workload: Path, out: Path, reuse: bool, timeout: int) -> bool:
    """Run it (False: `reuse` and a complete run with the same overrides is already there)."""
    manifest = out / "manifest.json"
    if reuse and manifest.exists():
        m = json.loads(manifest.read_text())
        given = [c for i, c in enumerate(m.get("command", [])) if i and
                 m["command"][i - 1] == "--set"]
        if m.get("status") == "complete" and given == p.sets:
            return False
    launch.run(p.processes, workload, p.sets, out, timeout=timeout)
    return True

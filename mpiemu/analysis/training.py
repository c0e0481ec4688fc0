"""Training efficiency of a run: MFU and HFU per iteration (rank 0's iteration time from the
trace, FLOPs as the run counted them, Megatron-LM's definitions: `training.flops`), and each
pipeline stage's bubble and recomputation time."""
from __future__ import annotations

from typing import Any

from .breakdown import rank_breakdowns
from .load import Run


def training_rows(run: Run) -> list[dict[str, Any]]:
    """Per iteration: time, MFU, HFU and the stages' bubbles (empty for other kinds)."""
    summary = run.manifest.get("summary") or {}
    flops = summary.get("flops")
    if not flops or not run.ranks:
        return []
    per_iter = {r["iteration"]: r for r in summary.get("iterations", [])}
    rows = []
    for b in rank_breakdowns(run.ranks[0]):
        denom = b.iteration_s * flops["devices"] * flops["peak_flops_per_s"]
        stages = per_iter.get(b.iteration, {}).get("stages", [])
        rows.append({"iteration": b.iteration, "iteration_s": b.iteration_s,
                     "mfu": flops["model"] / denom, "hfu": flops["hardware"] / denom,
                     "recompute_s": b.recompute_s, "stages": stages})
    return rows


def format_training(run: Run) -> list[str]:
    rows = training_rows(run)
    if not rows:
        return []
    lines = ["training efficiency (Megatron-LM MFU / HFU; bubble = a stage idle in the step):",
             f"{'iter':>4}{'iteration ms':>14}{'MFU %':>8}{'HFU %':>8}{'recompute ms':>14}"
             "  bubble ms per stage"]
    shown = rows if len(rows) <= 12 else rows[:6] + rows[-3:]
    for r in shown:
        bubbles = " ".join(f"{s['bubble_s'] * 1e3:.4f}" for s in r["stages"])
        lines.append(f"{r['iteration']:>4}{r['iteration_s'] * 1e3:>14.4f}"
                     f"{r['mfu'] * 100:>8.2f}{r['hfu'] * 100:>8.2f}"
                     f"{r['recompute_s'] * 1e3:>14.4f}  {bubbles}")
    return lines + [""]

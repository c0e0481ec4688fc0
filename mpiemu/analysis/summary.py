"""What `mpiemu analyze` prints: every table of a run, as text or as JSON-ready data."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict

from .breakdown import format_breakdown
from .critical_path import critical_path, path_summary
from .experts import experts_dict, format_experts
from .load import Run
from .network import busiest_ports, format_network
from .precision import drift_rows, format_drift
from .tables import first, op_totals, rank_budget
from .training import format_training, training_rows


def format_tables(run: Run, top: int | None = 25) -> list[str]:
    """Human-readable per-rank and per-op tables."""
    lines = [f"run {run.path}  status={run.manifest.get('status', '?')}  "
             f"ranks={len(run.ranks)}  makespan={run.makespan * 1e3:.4f} ms"]
    if run.stands_for:
        n = sum(len(v) for v in run.stands_for.values())
        lines.append(f"folded: {len(run.ranks)} representatives stand for {n} emulated GPUs "
                     "(each row for its stage's images, whose timelines are identical; per-op "
                     "totals are the representatives'; load(run, expand=True) expands)")
    lines.append(f"{'rank':>5}{'makespan ms':>14}{'compute ms':>12}{'collective ms':>15}"
                 f"{'exposed comm ms':>17}{'events':>9}  complete")
    for rt in run.ranks:
        b = rank_budget(rt)
        lines.append(f"{b.rank:>5}{b.makespan_s * 1e3:>14.4f}{b.compute_s * 1e3:>12.4f}"
                     f"{b.collective_s * 1e3:>15.4f}{b.exposed_comm_s * 1e3:>17.4f}"
                     f"{b.events:>9}  {b.complete}")
    lines.append("")
    lines.append(f"{'op':<28}{'cat':<11}{'count':>8} {'total ms':>12} {'MB':>12} "
                 f"{'GFLOP':>12} {'DRAM MB':>12}")
    for r in first(op_totals(run), top):   # a space between numbers at any magnitude
        lines.append(f"{r.name[:27]:<28}{r.cat:<11}{r.count:>8} {r.total_s * 1e3:>12.4f} "
                     f"{r.bytes / 1e6:>12.3f} {r.flops / 1e9:>12.3f} "
                     f"{r.dram_bytes / 1e6:>12.3f}")
    lines.append("")
    lines += format_network(run)
    if rows := format_breakdown(run):
        lines += ["per iteration (rank 0; exp = exposed):", *rows, ""]
    lines += format_training(run)
    lines += format_drift(run)
    lines += format_experts(run)
    lines += path_summary(critical_path(run), top=12 if top is None or top < 0 else min(top, 12))
    return lines


def summary_dict(run: Run, top: int | None = None) -> dict[str, object]:
    """What `mpiemu analyze` prints, as JSON-ready data (times in seconds, `_s`; every op
    unless `top` says how many)."""
    path = critical_path(run)
    by_cat: dict[str, float] = defaultdict(float)
    for p in path:
        by_cat[p.cat] += p.t_end - p.t_start
    return {"run": str(run.path), "status": run.manifest.get("status"),
            "makespan_s": run.makespan, "problems": run.problems,
            "ranks": [asdict(rank_budget(rt)) for rt in run.ranks],
            "ops": [asdict(r) for r in first(op_totals(run), top)],
            "ports": [asdict(p) | {"share": p.share} for p in busiest_ports(run)],
            "critical_path_s": dict(by_cat), "training": training_rows(run),
            **({"drift": rows} if (rows := drift_rows(run)) else {}),
            **({"experts": ex} if (ex := experts_dict(run)) else {})}

"""First-level tables: per-rank time budget and per-op totals (`mpiemu analyze`)."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from .critical_path import critical_path, path_summary
from .load import RankTrace, Run


def union_length(starts: np.ndarray, ends: np.ndarray) -> float:
    """Total length covered by a set of intervals (overlaps counted once). Vectorized, and
    bit for bit the sequential sweep: merged segments' lengths added left to right
    (`np.add.accumulate` is sequential), the last one as `(total + end) - start`."""
    if len(starts) == 0:
        return 0.0
    order = np.argsort(starts, kind="stable")
    s = np.asarray(starts, dtype=np.float64)[order]
    reach = np.maximum.accumulate(np.asarray(ends, dtype=np.float64)[order])
    first = np.flatnonzero(np.r_[True, s[1:] > reach[:-1]])     # each merged segment's start
    last = np.r_[first[1:] - 1, len(s) - 1]
    done = np.add.accumulate(reach[last[:-1]] - s[first[:-1]])[-1] if len(first) > 1 else 0.0
    return float((done + reach[last[-1]]) - s[first[-1]])


@dataclass(frozen=True)
class RankBudget:
    """Where one rank's emulated time went."""

    rank: int
    makespan_s: float
    compute_s: float          # union of compute ops
    collective_s: float       # union of collective spans
    exposed_comm_s: float     # collective time not hidden under compute
    events: int
    complete: bool


def rank_budget(rt: RankTrace) -> RankBudget:
    ev = rt.events
    comp = rt.is_cat("compute")
    coll = rt.is_cat("collective")
    t0, t1 = ev["t_start"], ev["t_end"]
    compute = union_length(t0[comp], t1[comp])
    collective = union_length(t0[coll], t1[coll])
    both = union_length(np.concatenate([t0[comp], t0[coll]]), np.concatenate([t1[comp], t1[coll]]))
    makespan = float(t1.max()) if len(ev) else 0.0
    return RankBudget(rt.rank, makespan, compute, collective, both - compute, len(ev),
                      rt.complete)


@dataclass(frozen=True)
class OpTotal:
    """All events of one (name, category) across ranks."""

    name: str
    cat: str
    count: int
    total_s: float
    bytes: int
    flops: float
    dram_bytes: int


def op_totals(run: Run) -> list[OpTotal]:
    """Totals per (name, category): one group-by per rank on the coded names (np.unique +
    bincount), so the cost is linear in events whatever the number of distinct ops."""
    acc: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0, 0, 0.0, 0])
    for rt in run.ranks:
        ev = rt.events
        if len(ev) == 0:
            continue
        code = ev["name"].astype(np.int64) * 256 + ev["cat"].astype(np.int64)
        uniq, first, inv = np.unique(code, return_index=True, return_inverse=True)
        sums = [np.bincount(inv, weights=w, minlength=len(uniq)) for w in (
            ev["t_end"] - ev["t_start"], ev["bytes"].astype(float), ev["flops"],
            ev["dram_bytes"].astype(float))]
        counts = np.bincount(inv, minlength=len(uniq))
        for g, i in enumerate(first):
            a = acc[(str(rt.names[i]), str(rt.cats[i]))]
            a[0] += int(counts[g])
            a[1] += float(sums[0][g])
            a[2] += int(sums[1][g])
            a[3] += float(sums[2][g])
            a[4] += int(sums[3][g])
    rows = [OpTotal(n, c, int(a[0]), a[1], int(a[2]), a[3], int(a[4]))
            for (n, c), a in acc.items()]
    return sorted(rows, key=lambda r: (-r.total_s, r.name, r.cat))


def format_tables(run: Run, top: int = 25) -> list[str]:
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
    for r in op_totals(run)[:top]:         # a space between numbers at any magnitude
        lines.append(f"{r.name[:27]:<28}{r.cat:<11}{r.count:>8} {r.total_s * 1e3:>12.4f} "
                     f"{r.bytes / 1e6:>12.3f} {r.flops / 1e9:>12.3f} "
                     f"{r.dram_bytes / 1e6:>12.3f}")
    lines.append("")
    from .breakdown import format_breakdown  # noqa: PLC0415 (breakdown imports this module)
    from .network import format_network  # noqa: PLC0415 (network imports this module)
    lines += format_network(run)
    if rows := format_breakdown(run):
        lines += ["per iteration (rank 0; exp = exposed):", *rows, ""]
    from .training import format_training  # noqa: PLC0415
    lines += format_training(run)
    lines += path_summary(critical_path(run), top=min(top, 12))
    return lines


def summary_dict(run: Run, top: int = 25) -> dict[str, object]:
    """What `mpiemu analyze` prints, as JSON-ready data (times in seconds, `_s`)."""
    from dataclasses import asdict  # noqa: PLC0415

    from .critical_path import critical_path  # noqa: PLC0415
    from .network import busiest_ports  # noqa: PLC0415
    from .training import training_rows  # noqa: PLC0415
    path = critical_path(run)
    by_cat: dict[str, float] = defaultdict(float)
    for p in path:
        by_cat[p.cat] += p.t_end - p.t_start
    return {"run": str(run.path), "status": run.manifest.get("status"),
            "makespan_s": run.makespan, "problems": run.problems,
            "ranks": [asdict(rank_budget(rt)) for rt in run.ranks],
            "ops": [asdict(r) for r in op_totals(run)[:top]],
            "ports": [asdict(p) | {"share": p.share} for p in busiest_ports(run)],
            "critical_path_s": dict(by_cat), "training": training_rows(run)}

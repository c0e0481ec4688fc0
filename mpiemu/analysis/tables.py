"""First-level tables: per-rank time budget and per-op totals (`mpiemu analyze`)."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from .intervals import union_length
from .load import Run
from .rank_trace import RankTrace

T = TypeVar("T")


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


def first(rows: list[T], top: int | None) -> list[T]:
    """The first `top` rows (all of them for None or a negative `top`)."""
    return rows if top is None or top < 0 else rows[:top]

"""Per-iteration breakdown of a training run: compute, exposed TP and DP communication.

An iteration runs from the previous iteration's last event to its own last event (events
carry the iteration label). Within it: compute is the union of compute events; TP
communication counts only where model-parallel collectives (TP, expert parallelism's
all-to-alls, and the gradient norm's all-reduce over TP x PP) are not under compute (serialized all-reduces / reduce-scatters,
thesis 4.5.1); DP communication only where gradient-synchronization collectives (DP
buckets, the tied embedding between the first and last stage) are under neither (the part
of the bucketed gradient all-reduce backward did not hide, thesis 4.5.1 / 5.1.1.2); idle is
what remains (waiting on a peer, launch gaps; with pp > 1 mostly the pipeline bubble).
`recompute_s` is the compute spent recomputing activations (phase "recompute").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np

from ..sim.events import CATS
from .load import Run
from .rank_trace import RankTrace
from .intervals import union_length


# model-parallel collectives (EP's all-to-alls among them, as Megatron counts EP)
TP_GROUPS = ("coll.tp", "coll.mp", "coll.world", "coll.ep")
DP_GROUPS = ("coll.dp", "coll.embed", "coll.edp")    # gradient synchronization
# the event fields a breakdown reads (a running rank reads back only these: runner/train.py)
BREAKDOWN_FIELDS = ("name", "cat", "resource", "phase", "iteration", "t_start", "t_end")
# the only categories a breakdown counts (messages, three in four events, only set windows)
COUNTED_CATS = np.array([CATS["compute"], CATS["collective"]], dtype=np.uint8)


@dataclass(frozen=True)
class IterationBreakdown:
    """Where one iteration's emulated time went on one rank (seconds)."""

    iteration: int
    t_start: float
    t_end: float
    compute_s: float
    tp_exposed_s: float
    dp_exposed_s: float
    tp_total_s: float
    dp_total_s: float
    recompute_s: float = 0.0

    @property
    def iteration_s(self) -> float:
        return self.t_end - self.t_start

    @property
    def idle_s(self) -> float:
        return self.iteration_s - self.compute_s - self.tp_exposed_s - self.dp_exposed_s


def window_of(blocks: Iterable[np.ndarray], iteration: int, rank: int = -1
              ) -> tuple[float, float]:
    """An iteration's window from blocks of events (fields iteration, t_start, t_end), read
    one at a time: from the last end of the iterations before it (or its own first start)
    to its own last end."""
    first, last, before = np.inf, -np.inf, -np.inf
    for ev in blocks:
        it = ev["iteration"]
        mine = it == iteration
        if mine.any():
            first = min(first, float(ev["t_start"][mine].min()))
            last = max(last, float(ev["t_end"][mine].max()))
        prev = (it < iteration) & (it >= 0)
        if prev.any():
            before = max(before, float(ev["t_end"][prev].max()))
    if last == -np.inf:
        raise ValueError(f"rank {rank} has no events of iteration {iteration}")
    return (before if before > -np.inf else first), last


def counted(ev: np.ndarray) -> np.ndarray:
    """The events a breakdown counts (compute and collectives), as a mask."""
    return np.isin(ev["cat"], COUNTED_CATS)


def iteration_breakdown(rt: RankTrace, iteration: int,
                        window: tuple[float, float] | None = None,
                        sync_is_idle: bool = False) -> IterationBreakdown:
    """Compute / exposed TP / exposed DP communication of one iteration on one rank, in its
    own window or a given one (a pipeline stage seen in the step's window). `sync_is_idle`:
    the collectives that span pipeline stages (the optimizer's norm all-reduce, the tied
    embedding's `pp.*`) count as idle, being almost all waiting for the other stages, so a
    stage's idle time is its pipeline bubble."""
    t0, t1 = window if window is not None else window_of([rt.events], iteration, rt.rank)
    inside = np.flatnonzero((rt.events["t_end"] > t0) & (rt.events["t_start"] < t1))
    return _breakdown(rt, inside, iteration, t0, t1, sync_is_idle)


def _breakdown(rt: RankTrace, inside: np.ndarray, iteration: int, t0: float, t1: float,
               sync_is_idle: bool = False) -> IterationBreakdown:
    """The breakdown from the events overlapping the window [t0, t1]."""
    sub = None if len(inside) == len(rt.events) else inside   # the usual report: no copies
    coll = rt.is_cat("collective", sub)
    if sync_is_idle:
        coll &= ~rt.name_startswith(("optim.", "pp."), sub)
    sets = []
    tp = rt.resource_in(TP_GROUPS, sub)
    dp = rt.resource_in(DP_GROUPS, sub)
    comp = rt.is_cat("compute", sub)
    recompute = comp & rt.is_phase("recompute", sub)
    for m in (comp, coll & tp, coll & dp, recompute):
        sel = inside[m]
        sets.append((np.clip(rt.events["t_start"][sel], t0, t1),
                     np.clip(rt.events["t_end"][sel], t0, t1)))

    def union(*idx: int) -> float:
        return union_length(np.concatenate([sets[i][0] for i in idx]),
                            np.concatenate([sets[i][1] for i in idx]))

    compute, with_tp, everything = union(0), union(0, 1), union(0, 1, 2)
    return IterationBreakdown(iteration, t0, t1, compute, with_tp - compute,
                              everything - with_tp, union(1), union(2), union(3))


def rank_breakdowns(rt: RankTrace) -> list[IterationBreakdown]:
    """Every iteration of one rank at once: windows from per-iteration extremes, events of a
    window found by binary search on start times (linear in events, not iterations x events)."""
    ev = rt.events
    it = ev["iteration"].astype(np.int64)
    vals, inv = np.unique(it, return_inverse=True)
    ends = np.full(len(vals), -np.inf)
    starts_min = np.full(len(vals), np.inf)
    np.maximum.at(ends, inv, ev["t_end"])
    np.minimum.at(starts_min, inv, ev["t_start"])
    keep = vals >= 0
    vals, ends, starts_min = vals[keep], ends[keep], starts_min[keep]
    if len(vals) == 0:
        return []
    before = np.concatenate([[-np.inf], np.maximum.accumulate(ends)[:-1]])
    order = np.argsort(ev["t_start"], kind="stable")
    by_start = ev["t_start"][order]
    longest = float(np.max(ev["t_end"] - ev["t_start"]))
    out = []
    for k, iteration in enumerate(vals):
        t0 = before[k] if np.isfinite(before[k]) else starts_min[k]
        t1 = ends[k]
        lo = np.searchsorted(by_start, t0 - longest, "left")
        hi = np.searchsorted(by_start, t1, "left")
        cand = order[lo:hi]
        inside = np.sort(cand[ev["t_end"][cand] > t0])
        out.append(_breakdown(rt, inside, int(iteration), float(t0), float(t1)))
    return out


def run_breakdown(run: Run) -> list[list[IterationBreakdown]]:
    """Per rank, the breakdown of every iteration found in its trace."""
    return [rank_breakdowns(rt) for rt in run.ranks]


def format_breakdown(run: Run) -> list[str]:
    """Rank 0's per-iteration table plus the slowest rank's iteration time."""
    per_rank = run_breakdown(run)
    if not per_rank or not per_rank[0]:
        return []
    lines = [f"{'iter':>4}{'iteration ms':>14}{'compute ms':>12}{'TP exp ms':>11}"
             f"{'DP exp ms':>11}{'TP total ms':>13}{'DP total ms':>13}{'idle ms':>10}"
             f"{'slowest rank ms':>17}"]
    rows = list(enumerate(per_rank[0]))
    shown = rows if len(rows) <= 20 else rows[:10] + rows[-5:]
    for n, (i, b) in enumerate(shown):
        if n == 10 and len(rows) > 20:
            mean = sum(x.iteration_s for x in per_rank[0]) / len(per_rank[0])
            lines.append(f"{'...':>4}  {len(rows) - 15} more iterations; mean iteration "
                         f"{mean * 1e3:.4f} ms over all {len(rows)}")
        slowest = max(r[i].iteration_s for r in per_rank if len(r) > i)
        lines.append(f"{b.iteration:>4}{b.iteration_s * 1e3:>14.4f}{b.compute_s * 1e3:>12.4f}"
                     f"{b.tp_exposed_s * 1e3:>11.4f}{b.dp_exposed_s * 1e3:>11.4f}"
                     f"{b.tp_total_s * 1e3:>13.4f}{b.dp_total_s * 1e3:>13.4f}"
                     f"{b.idle_s * 1e3:>10.4f}{slowest * 1e3:>17.4f}")
    return lines

"""Critical path through a run: the chain of ops that decided the makespan.

Start from the op that ends last on any rank and walk back: an op's predecessor is an op that
ends exactly when it starts, on the same resource stream, else on the same rank, else on the
peer rank its message came from (a receive completes at the sender's arrival time). Emulated
time is exact, so the tie is an equality up to rounding. Where nothing ends at an op's start the
rank was waiting: the gap is charged as `idle` and the walk continues on the same rank.
"""
from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple

import numpy as np

from .load import Run
from .rank_trace import RankTrace

WALK_CATS = ("compute", "comm", "memory")


class PathStep(NamedTuple):
    """One op on the critical path (or an idle gap, name='idle')."""

    rank: int
    name: str
    cat: str
    resource: str
    t_start: float
    t_end: float


class _Index:
    """Per rank: the walkable ops and their ends, for fast 'what ends at t' queries."""

    def __init__(self, rt: RankTrace) -> None:
        ev = rt.events
        keep = np.isin(rt.cats, WALK_CATS) & (ev["t_end"] > ev["t_start"])
        idx = np.flatnonzero(keep)
        order = np.argsort(ev["t_end"][idx], kind="stable")   # by end: binary searches
        self.idx = idx[order]
        self.ends = ev["t_end"][self.idx]
        self.rt = rt

    def ending_at(self, t: float, tol: float) -> np.ndarray:
        """Ops whose end is within tol of t, in recorded order (O(log n) per query)."""
        lo = np.searchsorted(self.ends, t - tol, "left")
        hi = np.searchsorted(self.ends, t + tol, "right")
        return np.sort(self.idx[lo:hi])

    def last_before(self, t: float) -> int | None:
        """The op that ended last before t (the first recorded of equals)."""
        pos = int(np.searchsorted(self.ends, t, "left")) - 1
        if pos < 0:
            return None
        first = int(np.searchsorted(self.ends, self.ends[pos], "left"))
        return int(np.min(self.idx[first:pos + 1]))


def _step(rt: RankTrace, i: int) -> PathStep:
    ev = rt.events
    return PathStep(rt.rank, str(rt.names[i]), str(rt.cats[i]), str(rt.resources[i]),
                    float(ev["t_start"][i]), float(ev["t_end"][i]))


def _pick(rt: RankTrace, cands: np.ndarray, resource: str) -> int | None:
    if len(cands) == 0:
        return None
    same = [c for c in cands if rt.resources[c] == resource]
    return int(same[0] if same else cands[0])


def _other_rank(index: dict[int, _Index], rank: int, peer: int, t: float, tol: float,
                seen: set[tuple[int, int]]) -> tuple[int, int] | None:
    """An op on another rank (the recorded peer first) that ends exactly at t."""
    order = ([peer] if peer in index and peer != rank else []) + \
        [r for r in sorted(index) if r not in (rank, peer)]
    for r in order:
        hit = _pick(index[r].rt, _fresh(index[r].ending_at(t, tol), r, seen), "")
        if hit is not None:
            return r, hit
    return None


def _fresh(cands: np.ndarray, rank: int, seen: set[tuple[int, int]]) -> np.ndarray:
    """Candidates not on the path yet: an op shorter than the tolerance ends 'at' its own
    start, and must not become its own predecessor (the walk would never end)."""
    return np.array([c for c in cands if (rank, int(c)) not in seen], dtype=np.int64)


def critical_path(run: Run, tol_rel: float = 1e-9) -> list[PathStep]:
    """Ops (and idle gaps) on the critical path, latest first."""
    index = {rt.rank: _Index(rt) for rt in run.ranks}
    ends = [(float(ix.ends.max()), r) for r, ix in index.items() if len(ix.ends)]
    if not ends:
        return []
    _, rank = max(ends)
    ix = index[rank]
    cur: int | None = int(ix.idx[np.argmax(ix.ends)])
    tol = tol_rel * max(run.makespan, 1e-30)
    path: list[PathStep] = []
    seen: set[tuple[int, int]] = set()
    while cur is not None:
        rt = index[rank].rt
        step = _step(rt, cur)
        path.append(step)
        seen.add((rank, cur))
        if step.t_start <= tol:
            break
        nxt = _pick(rt, _fresh(index[rank].ending_at(step.t_start, tol), rank, seen),
                    step.resource)
        if nxt is None:                                   # a message: look at other ranks
            hop = _other_rank(index, rank, int(rt.events["peer"][cur]), step.t_start, tol,
                              seen)
            if hop is not None:
                rank, cur = hop
                continue
        if nxt is None:                                   # waiting: charge the gap as idle
            prev = index[rank].last_before(step.t_start)
            t_prev = 0.0 if prev is None else float(rt.events["t_end"][prev])
            path.append(PathStep(rank, "idle", "idle", "-", t_prev, step.t_start))
            nxt = prev
        cur = nxt
    return path


def path_summary(path: list[PathStep], top: int = 12) -> list[str]:
    """Critical-path time by category and by op name."""
    total = sum(p.t_end - p.t_start for p in path)
    by_cat: dict[str, float] = defaultdict(float)
    by_name: dict[str, float] = defaultdict(float)
    for p in path:
        by_cat[p.cat] += p.t_end - p.t_start
        by_name[p.name] += p.t_end - p.t_start
    lines = [f"critical path: {len(path)} ops, {total * 1e3:.4f} ms, "
             f"crossing ranks {sorted({p.rank for p in path})}"]
    lines += [f"  {cat:<12}{t * 1e3:>12.4f} ms {100 * t / total:>6.1f}%"
              for cat, t in sorted(by_cat.items(), key=lambda kv: -kv[1])] if total else []
    lines.append("  top ops on the path:")
    lines += [f"    {name[:34]:<36}{t * 1e3:>12.4f} ms"
              for name, t in sorted(by_name.items(), key=lambda kv: -kv[1])[:top]]
    return lines

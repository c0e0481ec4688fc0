"""A part of a run: some ranks, some iterations, a window of emulated time.

Exports of large runs (a 64-rank Perfetto JSON exceeds what the UI opens) take the part the
user asks for: `mpiemu export RUN --ranks 0-7 --iterations 1 --window 10:20` (ms). The part
is a `Run` like any other: every writer and analysis reads it unchanged.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from .load import Run
from .rank_trace import RankTrace


def parse_ids(text: str, field: str) -> list[int]:
    """'0-3,8,12-13' -> [0, 1, 2, 3, 8, 12, 13]; refused in one line otherwise."""
    out: list[int] = []
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            a, b = int(lo), int(hi) if hi else int(lo)
            if a < 0 or b < a:
                raise ValueError
            out += range(a, b + 1)
    except ValueError:
        raise ValueError(f"{field}={text!r}: numbers and ranges such as 0-3,8") from None
    return sorted(set(out))


def parse_window(text: str) -> tuple[float, float]:
    """'10:20' (emulated ms) -> (0.010, 0.020) seconds; either end may be left out."""
    lo, sep, hi = text.partition(":")
    try:
        if not sep:
            raise ValueError
        a = float(lo) * 1e-3 if lo.strip() else 0.0
        b = float(hi) * 1e-3 if hi.strip() else float("inf")
        if not a < b:
            raise ValueError
    except ValueError:
        raise ValueError(f"--window={text!r}: START:END in emulated ms, START < END (either "
                         "may be left out)") from None
    return a, b


def select(run: Run, ranks: list[int] | None = None, iterations: list[int] | None = None,
           window: tuple[float, float] | None = None) -> Run:
    """The events of these ranks, iterations and time window (an event overlapping the
    window is kept whole); None keeps everything of that kind."""
    have = {rt.rank for rt in run.ranks}
    if ranks is not None and not set(ranks) & have:
        raise ValueError(f"--ranks={ranks[:8]}: none of them is in this run (ranks "
                         f"{min(have)}-{max(have)})")
    kept = [_part(rt, iterations, window) for rt in run.ranks
            if ranks is None or rt.rank in ranks]
    return replace(run, ranks=kept,
                   stands_for={r: v for r, v in run.stands_for.items()
                               if ranks is None or r in ranks})


def _part(rt: RankTrace, iterations: list[int] | None,
          window: tuple[float, float] | None) -> RankTrace:
    ev = rt.events
    keep = np.ones(len(ev), dtype=bool)
    if iterations is not None:
        keep &= np.isin(ev["iteration"], iterations)
    if window is not None:
        keep &= (ev["t_end"] >= window[0]) & (ev["t_start"] <= window[1])
    if keep.all():
        return rt
    idx = np.flatnonzero(keep)

    def part(a: np.ndarray | None) -> np.ndarray | None:
        return None if a is None else a[idx]
    return RankTrace(rt.rank, rt.attrs, ev[idx], rt.table, part(rt._names),
                     part(rt._resources), part(rt._cats), part(rt._phases))

"""Gantt chart of a run: one row per (rank, resource stream), coloured by category.

A rank's network messages share two rows, `net out` (every route leaving its ports) and
`net in` (what it received), so every rank fits; `ranks` picks some explicitly, and the
title says so. Only rows with an event in the window are drawn, the legend lists only the
categories that occur, dashed lines mark where each iteration starts (rank 0's), the ops
long enough for their name carry it, and a folded representative's rows say how many GPUs
they stand for. Times on the axis and in the window options are milliseconds."""
from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from .export import iteration_spans
from .load import Run
from .network import egress_port

COLOURS = {"compute": "#4C72B0", "comm": "#DD8452", "memory": "#55A868", "wait": "#C7C7C7",
           "collective": "#C44E52"}
MAX_LABELS = 150            # op names drawn at most (the longest ops first)


class Row(NamedTuple):
    label: str
    t0: np.ndarray          # ms
    t1: np.ndarray
    cats: np.ndarray
    names: np.ndarray


def _row(res: str) -> str:
    if res.startswith("in:"):
        return "net in"
    return "net out" if egress_port(res) is not None else res


def gantt_rows(run: Run, t_min_ms: float | None = None, t_max_ms: float | None = None,
               ranks: list[int] | None = None) -> list[Row]:
    """The rows a Gantt chart draws: every (rank, stream) with an event in the window."""
    lo = -np.inf if t_min_ms is None else t_min_ms
    hi = np.inf if t_max_ms is None else t_max_ms
    rows: list[Row] = []
    for rt in run.ranks:
        if ranks is not None and rt.rank not in ranks:
            continue
        images = run.stands_for.get(rt.rank, [])
        who = f"r{rt.rank}" + (f" (x{len(images)})" if len(images) > 1 else "")
        kind = np.array([_row(str(r)) for r in rt.resources], dtype=object)
        t0, t1 = rt.events["t_start"] * 1e3, rt.events["t_end"] * 1e3
        inside = (t1 >= lo) & (t0 <= hi) & np.isin(rt.cats, list(COLOURS))
        for res in sorted(set(kind[inside]) - {"-"}, key=lambda r: (r != "compute", r)):
            m = inside & (kind == res)
            rows.append(Row(f"{who} {res}", t0[m], t1[m], rt.cats[m], rt.names[m]))
    return rows


def gantt(run: Run, path: Path, *, t_min_ms: float | None = None,
          t_max_ms: float | None = None, ranks: list[int] | None = None) -> Path:
    """Write a PNG timeline (matplotlib, Agg backend); long runs belong in Perfetto."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    rows = gantt_rows(run, t_min_ms, t_max_ms, ranks)
    fig, ax = plt.subplots(figsize=(12, 0.32 * len(rows) + 1.4))
    for y, r in enumerate(rows):
        for cat, colour in COLOURS.items():
            m = r.cats == cat
            if m.any():
                ax.broken_barh(list(zip(r.t0[m], r.t1[m] - r.t0[m])), (y - 0.4, 0.8),
                               facecolors=colour)
    if t_min_ms is not None or t_max_ms is not None:
        ax.set_xlim(t_min_ms, t_max_ms)
    _names(ax, rows)
    _iterations(ax, run)
    ax.set_yticks(range(len(rows)), labels=[r.label for r in rows], fontsize=7)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlabel("emulated time (ms)")
    seen = [c for c in COLOURS if any((r.cats == c).any() for r in rows)]
    ax.legend([plt.Rectangle((0, 0), 1, 1, color=COLOURS[c]) for c in seen], seen,
              loc="lower right", fontsize=7, ncol=max(len(seen), 1), framealpha=0.9)
    shown = sorted({r.label.split()[0] for r in rows})
    which = "" if ranks is None else f" ({', '.join(shown)} shown)"
    ax.set_title(f"{run.path.name}: {len(run.ranks)} ranks{which}, makespan "
                 f"{run.makespan * 1e3:.3f} ms", fontsize=9)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _names(ax: Any, rows: list[Row]) -> None:
    """Each op's name inside its bar where the bar is wide enough (the longest first)."""
    x0, x1 = ax.get_xlim()
    need = (x1 - x0) * 0.012                                 # ms per character, about
    cands = [(float(b - a), y, float(a), float(b), str(n)) for y, r in enumerate(rows)
             for a, b, n in zip(r.t0, r.t1, r.names) if b - a > need * 4]
    for width, y, a, b, name in sorted(cands, reverse=True)[:MAX_LABELS]:
        text = name[:max(int(width / need), 1)]
        ax.text(max(a, x0) + (min(b, x1) - max(a, x0)) / 2, y, text,
                ha="center", va="center", fontsize=5, color="white", clip_on=True)


def _iterations(ax: Any, run: Run) -> None:
    """A dashed line where each iteration starts (on the run's first rank)."""
    if not run.ranks:
        return
    for it, start, _ in iteration_spans(run.ranks[0]):
        ax.axvline(start * 1e3, color="#555555", lw=0.6, ls="--")
        ax.text(start * 1e3, -0.45, f"it {it}", fontsize=6,
                va="top", color="#555555", clip_on=True)

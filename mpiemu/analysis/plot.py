"""Gantt chart of a run: one row per (rank, resource stream), coloured by category.

A rank's network messages share two rows, `net out` (every route leaving its ports) and
`net in` (what it received), so every rank fits; `ranks` picks some explicitly, and the
title says so. Times on the axis and in the window options are milliseconds."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .load import Run
from .network import egress_port

COLOURS = {"compute": "#4C72B0", "comm": "#DD8452", "memory": "#55A868", "wait": "#C7C7C7",
           "collective": "#C44E52"}


def _row(res: str) -> str:
    if res.startswith("in:"):
        return "net in"
    return "net out" if egress_port(res) is not None else res


def gantt(run: Run, path: Path, *, t_min_ms: float | None = None,
          t_max_ms: float | None = None, ranks: list[int] | None = None) -> Path:
    """Write a PNG timeline (matplotlib, Agg backend); long runs belong in Perfetto."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    rows: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]] = []
    shown = [rt for rt in run.ranks if ranks is None or rt.rank in ranks]
    for rt in shown:
        kind = np.array([_row(str(r)) for r in rt.resources], dtype=object)
        for res in sorted(set(kind) - {"-"}, key=lambda r: (r != "compute", r)):
            m = kind == res
            rows.append((f"r{rt.rank} {res}", rt.events["t_start"][m], rt.events["t_end"][m],
                         rt.cats[m]))
    fig, ax = plt.subplots(figsize=(12, 0.32 * len(rows) + 1.2))
    for y, (_, t0, t1, cats) in enumerate(rows):
        for cat, colour in COLOURS.items():
            m = cats == cat
            if m.any():
                spans = [(float(a), float(b)) for a, b in
                         zip(t0[m] * 1e3, (t1[m] - t0[m]) * 1e3)]      # (start, width) ms
                ax.broken_barh(spans, (y - 0.4, 0.8), facecolors=colour)
    ax.set_yticks(range(len(rows)), labels=[r[0] for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("emulated time (ms)")
    if t_min_ms is not None or t_max_ms is not None:
        ax.set_xlim(t_min_ms, t_max_ms)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLOURS.values()]
    ax.legend(handles, list(COLOURS), loc="upper right", fontsize=7, ncol=len(COLOURS))
    which = "" if ranks is None else f" (ranks {sorted(r.rank for r in shown)} shown)"
    ax.set_title(f"{run.path.name}: {len(run.ranks)} ranks{which}, makespan "
                 f"{run.makespan * 1e3:.3f} ms", fontsize=9)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path

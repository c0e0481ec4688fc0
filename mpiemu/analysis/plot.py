"""Gantt chart of a run: one row per (rank, resource stream), coloured by category."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .load import Run

COLOURS = {"compute": "#4C72B0", "comm": "#DD8452", "memory": "#55A868", "wait": "#C7C7C7",
           "collective": "#C44E52"}


def gantt(run: Run, path: Path, *, t_min: float | None = None, t_max: float | None = None,
          max_rows: int = 48) -> Path:
    """Write a PNG timeline (matplotlib, Agg backend); long runs belong in Perfetto."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    rows: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]] = []
    for rt in run.ranks:
        for res in sorted(set(rt.resources) - {"-"}, key=lambda r: (r != "compute", r)):
            m = rt.resources == res
            rows.append((f"r{rt.rank} {res}", rt.events["t_start"][m], rt.events["t_end"][m],
                         rt.cats[m]))
    rows = rows[:max_rows]
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
    if t_min is not None or t_max is not None:
        ax.set_xlim(None if t_min is None else t_min * 1e3, None if t_max is None else t_max * 1e3)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLOURS.values()]
    ax.legend(handles, list(COLOURS), loc="upper right", fontsize=7, ncol=len(COLOURS))
    ax.set_title(f"{run.path.name}: {len(run.ranks)} ranks, makespan "
                 f"{run.makespan * 1e3:.3f} ms", fontsize=9)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path

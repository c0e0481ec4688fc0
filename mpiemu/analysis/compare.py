"""Run-to-run comparison: makespan and per-op totals of two runs side by side."""
from __future__ import annotations

from .load import Run
from .tables import first, op_totals

Totals = dict[tuple[str, str], float]


def _changed(a: Run, b: Run) -> tuple[Totals, Totals, list[tuple[str, str]]]:
    """Per-op totals of A and B, and the (name, cat) keys, largest change first (ties by
    name: the same table every time)."""
    ta = {(r.name, r.cat): r.total_s for r in op_totals(a)}
    tb = {(r.name, r.cat): r.total_s for r in op_totals(b)}
    keys = sorted(set(ta) | set(tb), key=lambda k: (-abs(tb.get(k, 0.0) - ta.get(k, 0.0)), k))
    return ta, tb, keys


def compare_dict(a: Run, b: Run, top: int | None = None) -> dict[str, object]:
    """The comparison as JSON-ready data (seconds; every op unless `top` says how many)."""
    ta, tb, keys = _changed(a, b)
    return {"a": str(a.path), "b": str(b.path), "makespan_a_s": a.makespan,
            "makespan_b_s": b.makespan,
            "speedup": a.makespan / b.makespan if b.makespan > 0 else None,
            "notes": differences(a, b),
            "ops": [{"name": n, "cat": c, "a_s": ta.get((n, c), 0.0), "b_s": tb.get((n, c), 0.0)}
                    for n, c in first(keys, top)]}


def differences(a: Run, b: Run) -> list[str]:
    """What makes the per-op totals of two runs not like for like: their rank counts (the
    totals sum over ranks) or their configurations."""
    out = []
    if len(a.ranks) != len(b.ranks):
        out.append(f"A has {len(a.ranks)} ranks and B {len(b.ranks)}: per-op totals sum over "
                   "ranks, so they differ by that alone")
    ha, hb = a.manifest.get("config_hash"), b.manifest.get("config_hash")
    if ha and hb and ha != hb:
        out.append("A and B ran different configurations (config_hash differs): `mpiemu "
                   "analyze --json` of each shows them")
    return out


def compare_lines(a: Run, b: Run, top: int | None = 20) -> list[str]:
    """A (baseline) vs B: makespan speedup and the ops whose total time changed most."""
    speed = a.makespan / b.makespan if b.makespan > 0 else float("inf")
    lines = [f"A {a.path}  makespan {a.makespan * 1e3:.4f} ms",
             f"B {b.path}  makespan {b.makespan * 1e3:.4f} ms",
             f"speedup of B over A: {speed:.4f}x  ({(speed - 1) * 100:+.2f}%)", "",
             f"{'op':<30}{'cat':<11}{'A ms':>12}{'B ms':>12}{'B-A ms':>12}"]
    ta, tb, keys = _changed(a, b)
    lines[3:3] = [f"note: {n}" for n in differences(a, b)]
    for name, cat in first(keys, top):
        x, y = ta.get((name, cat), 0.0), tb.get((name, cat), 0.0)
        lines.append(f"{name[:29]:<30}{cat:<11}{x * 1e3:>12.4f}{y * 1e3:>12.4f}"
                     f"{(y - x) * 1e3:>+12.4f}")
    return lines

"""A run's numbers against exact arithmetic (`training.drift`): each iteration's loss and
parameters beside a float64 reference, and the reference check's verdict in the run's own
precision; from the run's summary (runs with `train.check_reference` below fp64)."""
from __future__ import annotations

from typing import Any

from ..precision.fp8_gemm import numerics_label
from .load import Run


def drift_rows(run: Run) -> list[dict[str, Any]]:
    """Per iteration: the run's loss, the float64 reference's, their relative difference,
    and the parameters' relative error (median tensor, worst tensor)."""
    drift = (run.manifest.get("summary") or {}).get("drift") or {}
    return list(drift.get("iterations", []))


def format_drift(run: Run) -> list[str]:
    rows = drift_rows(run)
    if not rows:
        return []
    summary = run.manifest.get("summary") or {}
    config = run.manifest.get("config") or {}
    dtype = numerics_label(config.get("run", {}).get("numeric_dtype", "?"),
                           config.get("fp8", {}).get("recipe", "off"))
    lines = [f"precision: {dtype} numerics against a float64 reference (drift):",
             f"{'iter':>4}{'loss':>12}{'loss fp64':>12}{'rel diff':>10}"
             f"{'params: median':>16}{'worst':>10}  worst tensor"]
    for r in rows:
        med, mx = r["param_rel_err_median"], r["param_rel_err_max"]
        lines.append(f"{r['iteration']:>4}{r['loss']:>12.6f}{r['loss_fp64']:>12.6f}"
                     f"{_num(r['loss_rel_diff']):>10}{_num(med):>16}{_num(mx):>10}  "
                     f"{r['worst_param']}")
    g = summary["drift"].get("first_grads")
    if g and g.get("max") is not None:
        it = summary["drift"].get("first_grads_iteration", 0)
        lines.append(f"iteration {it}'s gradients: median tensor {g['median']:.2e}, worst "
                     f"{g['max']:.2e} ({g['worst']})")
    ref = summary.get("reference") or {}
    if ref.get("grad_rel_err") is not None:
        lines.append(f"against the reference in {dtype} (the check): gradients median "
                     f"{_num(ref.get('grad_median_rel_err'))}, worst {ref['grad_rel_err']:.2e}"
                     f"; losses {ref['loss_rel_err']:.2e}; "
                     f"{'PASS' if ref.get('passed') else 'FAIL'}")
    return lines + [""]


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2e}"

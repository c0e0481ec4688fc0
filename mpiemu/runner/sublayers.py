"""Workload kind "sublayers": sliced transformer sub-layers under every overlap strategy.

Thesis 8.5.1: OP and FC-2 (forward) and FC-1 and IP (backward, data gradient) are the TP
GEMMs followed by an all-reduce. For each model and sub-layer the row-parallel GEMM
[tokens, K*H/tp] x [K*H/tp, H] runs with its reduce-scatter and all-gather under each
strategy, all ranks starting together; rank 0 writes `sublayers.csv` with the time split,
the speedup over `sequential` and the DRAM traffic per op (reads / writes of GEMM, RS, AG).
With numerics on, every strategy's result is compared with the sequential one.
"""
from __future__ import annotations

import csv
from typing import Any

import numpy as np
from mpi4py import MPI

from ..overlap.api import GemmShape, gemm_then_reduce
from ..overlap.costs import OverlapStats
from ..overlap.strategy import Overlap
from ..config.workload import Workload
from .context import RankContext
from ..config.errors import ConfigError
from ..config.overlap_check import check_overlap_devices
from ..config.overlap_section import SUBLAYER_K, SublayerModel

FIELDS = ("model", "sublayer", "tp", "strategy", "m", "n", "k", "n_stages", "time_s",
          "speedup", "gemm_s", "gemm_isolated_s", "rs_s", "ag_s", "mca_threshold",
          "gemm_read", "gemm_write", "rs_read", "rs_write", "ag_read", "ag_write",
          "dram_total", "max_abs_diff")


def validate(w: Workload, world_size: int) -> None:
    """Shapes divide by tp; the device carries the parameters the strategies need."""
    tp, cfg = w.parallel.tp, w.sublayers
    for m in cfg.models:
        for sub in cfg.sublayers:
            if SUBLAYER_K[sub] * m.hidden % tp:
                raise ConfigError(f"sublayers.models[{m.name}].hidden", m.hidden,
                                  f"{SUBLAYER_K[sub]}*hidden must be divisible by "
                                  f"parallel.tp={tp} for {sub}")
    check_overlap_devices(w, cfg.strategies, "sublayers.strategies", cfg.sw_comm_cus)
    if w.run.numerics == "on":
        runs = sum(len(cfg.sw_comm_cus) if s == "sw-overlap" else 1 for s in cfg.strategies)
        flop = runs * sum(2.0 * m.tokens * m.hidden * SUBLAYER_K[sub] * m.hidden / tp
                          for m in cfg.models for sub in cfg.sublayers)
        if flop > w.run.numerics_budget_tflop * 1e12:
            raise ConfigError("run.numerics", "on",
                              f"the sweep's real GEMMs need about {flop / 1e12:.1f} TFLOP per "
                              f"rank (run.numerics_budget_tflop = "
                              f"{w.run.numerics_budget_tflop:g}); use run.numerics='off' (the "
                              "same emulated times) or smaller sublayers.models")


def _data(ctx: RankContext, m: SublayerModel, k: int, seed: int
          ) -> tuple[np.ndarray | None, np.ndarray | None]:
    if not ctx.numerics:
        return None, None
    rng = np.random.default_rng([ctx.w.run.seed, seed, ctx.grid.rank])
    x = rng.standard_normal((m.tokens, k)).astype(ctx.np_dtype)
    w = (rng.standard_normal((k, m.hidden)) / np.sqrt(k)).astype(ctx.np_dtype)
    return x, w


def _one(ctx: RankContext, ov: Overlap, m: SublayerModel, sub: str, x: np.ndarray | None,
         w: np.ndarray | None, index: int) -> tuple[float, OverlapStats, np.ndarray | None]:
    """Run one (sub-layer, strategy) with every rank starting at the same emulated time."""
    tc = ctx.tp
    k = SUBLAYER_K[sub] * m.hidden // tc.size
    t0 = ctx.world.allreduce(ctx.tl.now(), op=MPI.MAX)
    stats = OverlapStats()
    with ctx.tl.labelled(iteration=index):
        y, span = gemm_then_reduce(tc, x, w, cost=ctx.cost,
                                   shape=GemmShape(m.tokens, m.hidden, k),
                                   mode=ctx.w.sublayers.mode, dtype=ctx.w.run.emulated_dtype,
                                   after=t0, overlap=ov, name=f"{m.name}.{sub}", stats=stats)
    t_end = tc.comm.allreduce(span.t_end, op=MPI.MAX)
    ctx.end_iteration()
    return t_end - t0, stats, y


def _row(ctx: RankContext, m: SublayerModel, sub: str, ov: Overlap, t: float,
         st: OverlapStats, seq_t: float, diff: float) -> dict[str, Any]:
    k = SUBLAYER_K[sub] * m.hidden // ctx.tp.size
    row: dict[str, Any] = {
        "model": m.name, "sublayer": sub, "tp": ctx.tp.size, "strategy": ov.label,
        "m": m.tokens, "n": m.hidden, "k": k, "n_stages": st.n_stages, "time_s": t,
        "speedup": seq_t / t if t > 0 else 1.0, "gemm_s": st.gemm_s,
        "gemm_isolated_s": st.gemm_isolated_s, "rs_s": st.rs_s, "ag_s": st.ag_s,
        "mca_threshold": st.mca_threshold, "dram_total": st.dram_total, "max_abs_diff": diff}
    row.update(st.dram)
    return row


def run(ctx: RankContext) -> dict[str, Any]:
    """Every (model, sub-layer, strategy); sequential first, the speedup base."""
    cfg = ctx.w.sublayers
    overlaps = cfg.overlaps(ctx.w.overlap)
    overlaps.sort(key=lambda o: o.strategy != "sequential")
    rows: list[dict[str, Any]] = []
    index = 0
    for mi, m in enumerate(cfg.models):
        for si, sub in enumerate(cfg.sublayers):
            x, w = _data(ctx, m, SUBLAYER_K[sub] * m.hidden // ctx.tp.size, mi * 16 + si)
            seq_t, ref = 0.0, None
            for ov in overlaps:
                ctx.maybe_fail(index)
                t, st, y = _one(ctx, ov, m, sub, x, w, index)
                if ov.strategy == "sequential":
                    seq_t, ref = t, y
                diff = float(np.max(np.abs(y - ref))) if y is not None and ref is not None \
                    and y.size else 0.0
                rows.append(_row(ctx, m, sub, ov, t, st, seq_t, diff))
                index += 1
    _report(ctx, rows)
    return {"rows": rows}


def _report(ctx: RankContext, rows: list[dict[str, Any]]) -> None:
    lines = [f"sub-layers on tp={ctx.tp.size} ({ctx.spec.name}, "
             f"{'bidirectional' if ctx.w.overlap.bidirectional else 'unidirectional'} ring)",
             f"{'model':<11}{'sub-layer':<10}{'strategy':<16}{'us':>9}{'speedup':>9}"
             f"{'GEMM us':>9}{'RS us':>8}{'AG us':>8}{'DRAM MB':>9}"]
    for r in rows:
        lines.append(f"{r['model']:<11}{r['sublayer']:<10}{r['strategy']:<16}"
                     f"{r['time_s'] * 1e6:>9.1f}{r['speedup']:>9.3f}{r['gemm_s'] * 1e6:>9.1f}"
                     f"{r['rs_s'] * 1e6:>8.1f}{r['ag_s'] * 1e6:>8.1f}"
                     f"{r['dram_total'] / 1e6:>9.1f}")
    ctx.say(*lines)
    if ctx.rank == 0:
        with (ctx.out / "sublayers.csv").open("w", newline="") as f:
            wr = csv.DictWriter(f, fieldnames=FIELDS)
            wr.writeheader()
            for r in rows:
                wr.writerow({k: repr(v) if isinstance(v, float) else v for k, v in r.items()})

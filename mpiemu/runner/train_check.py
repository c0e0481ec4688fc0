"""A training run's numbers checked: against the one-process reference in the run's own
precision (`training.check`), and, below fp64, against exact arithmetic (`training.drift`).
Host-side, outside emulated time; only with `train.check_reference`."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..model.seeded import first_sample
from ..precision.fp8_gemm import Fp8Gemm, numerics_label
from ..precision.matmul import PrecisionGemm
from ..training.check import RefPrecision, check_against_reference
from ..training.drift import DriftLog, drift_from_fp64
from ..config.workload import Workload
from .context import RankContext
from .moe_setup import token_layout
from .train_setup import micro_batches, reference_tolerance, resolve

Trainer = Any        # runner.train.Trainer (which imports this module)


class RunDrift:
    """What the drift report needs from the run as it goes: the parameters after each
    iteration (under ZeRO-3, whose parameters are shards between steps, after the last
    only) and the reduced gradients the check judges."""

    def __init__(self, ctx: RankContext, trainer: Trainer) -> None:
        self.trainer = trainer
        self.log = DriftLog(ctx.world, (ctx.grid.tp_rank, trainer.model.place))
        self.sharded = trainer.grads.params is not None or \
            trainer.grads.expert_params is not None

    def after_step(self, it: int) -> None:
        t = self.trainer
        if t.first_grads is not None and self.log.first_grads_iteration is None:
            self.log.record_grads(t.first_grads, t.first_grads_iteration)
        if not self.sharded:
            self.log.record(it, self.trainer.model.P)

    def after_run(self, last: int) -> None:
        if self.sharded:
            self.log.record(last, self.trainer.model.P)


def drift_log(ctx: RankContext, trainer: Trainer) -> RunDrift | None:
    """A drift log where the run checks against the reference below fp64."""
    w = ctx.w
    if not (w.train.check_reference and ctx.numerics) or w.run.numeric_dtype == "fp64":
        return None
    return RunDrift(ctx, trainer)


def reference_precision(w: Workload, mb: int) -> RefPrecision:
    """The reference in the run's precision; under an [fp8] recipe its layers' GEMMs in
    FP8 over the step's micro-batches of `mb` samples, each DP rank's j-th together
    (`Reference`)."""
    recipe = w.fp8.to_recipe()
    if recipe is None:
        return RefPrecision(PrecisionGemm(w.run.numeric_dtype))
    m, dp = micro_batches(w), w.parallel.dp
    sets = [np.concatenate([np.arange(lo, lo + mb) for lo in
                            (first_sample(r, j, m, mb) for r in range(dp))]) for j in range(m)]
    return RefPrecision(PrecisionGemm(w.run.numeric_dtype),
                        Fp8Gemm(recipe, out=w.run.numeric_dtype,
                                from_master=w.optimizer.fp8_param_gather), sets)


def reference_summary(ctx: RankContext, trainer: Trainer, losses: list[float],
                      drift: RunDrift | None) -> dict[str, Any]:
    """Collective: the reference check (printed, and its verdict) and the drift from fp64."""
    w, grid = ctx.w, ctx.grid
    cfg, gb, dims = resolve(w)
    tokens = token_layout(w, dims.batch)
    chk = check_against_reference(ctx.world, cfg, w.optimizer.to_config(), w.run.seed, gb,
                                  grid.tp, (grid.tp_rank, trainer.model.place),
                                  trainer.model.P,  # type: ignore[arg-type]
                                  losses, ctx.np_dtype, reference_tolerance(w), tokens,
                                  reference_precision(w, dims.batch), trainer.first_grads,
                                  trainer.first_grads_iteration)
    ctx.say(chk.line())
    out: dict[str, Any] = {"reference": chk.as_dict()}
    if drift is not None:
        report = None
        if ctx.rank == 0:
            report = drift_from_fp64(cfg, w.optimizer.to_config(), w.run.seed, gb, tokens,
                                     losses, drift.log, grid.tp)
        out["drift"] = ctx.world.bcast(report, root=0)
        ctx.say(drift_line(numerics_label(w.run.numeric_dtype, w.fp8.recipe), out["drift"]))
    return out


def drift_line(dtype: str, d: dict[str, Any]) -> str:
    """One line: the largest loss difference, the last iteration's parameters, the judged
    gradients, each against the float64 reference."""
    rows = d["iterations"]
    loss = max((r for r in rows if r["loss_rel_diff"] is not None),
               key=lambda r: r["loss_rel_diff"], default=None)
    last = [r for r in rows if r["param_rel_err_max"] is not None][-1:]
    parts = []
    if loss is not None:
        parts.append(f"losses up to {loss['loss_rel_diff']:.2e} (iteration {loss['iteration']})")
    if last:
        r = last[0]
        parts.append(f"parameters after iteration {r['iteration']}: median tensor "
                     f"{r['param_rel_err_median']:.2e}, worst {r['param_rel_err_max']:.2e} "
                     f"({r['worst_param']})")
    g = d.get("first_grads")
    if g and g["max"] is not None:
        parts.append(f"iteration {d['first_grads_iteration']}'s gradients: median "
                     f"{g['median']:.2e}, worst "
                     f"{g['max']:.2e} ({g['worst']})")
    return f"drift of {dtype} from a float64 reference: " + "; ".join(parts)

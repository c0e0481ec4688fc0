"""How far a run below fp64 drifts from exact arithmetic: each iteration's loss and
parameters, and iteration 0's gradients, against a float64 reference of the same model,
seed and data (the one-process `Reference`, exact numpy).

This is the precision's own effect, rounding included, beside the reference check (which
compares with a reference in the same precision): a bf16 run's losses stay within about
1e-4 of exact on the quickstart while single weights move by up to the learning rate (Adam
turns a gradient that is rounding noise into an lr-sized step). Rank 0 keeps every rank's
parameters after each iteration (host-side, outside emulated time), so it is meant for the
small models a reference check runs; under ZeRO-3 (parameters sharded between steps) only
the last iteration's parameters are compared.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from ..model.config import ModelConfig
from .check import Place, Shards, tensor_errors
from .config import OptimizerConfig
from .reference import Reference
from .reference_moe import TokenLayout


class DriftLog:
    """Collective over `world`: every rank's parameters after each iteration, and its
    iteration 0 gradients, on rank 0."""

    def __init__(self, world: MPI.Comm, place: Place) -> None:
        self.world, self.place = world, place
        self.per_iteration: dict[int, Shards] = {}
        self.first_grads: Shards | None = None
        self.first_grads_iteration: int | None = None

    def _gather(self, tensors: dict[str, Any]) -> Shards | None:
        return self.world.gather((self.place, {k: np.array(v) for k, v in tensors.items()
                                               if v is not None}), root=0)

    def record(self, it: int, params: dict[str, Any]) -> None:
        got = self._gather(params)
        if got is not None:
            self.per_iteration[it] = got

    def record_grads(self, grads: dict[str, np.ndarray], it: int) -> None:
        """The gradients the reference check judges (of iteration `it`)."""
        self.first_grads, self.first_grads_iteration = self._gather(grads), it


def _stats(errs: list[tuple[float, str]]) -> dict[str, Any]:
    if not errs:
        return {"max": None, "median": None, "worst": "-"}
    worst = max(errs)
    return {"max": worst[0], "median": float(np.median([e for e, _ in errs])),
            "worst": worst[1]}


def drift_from_fp64(cfg: ModelConfig, opt: OptimizerConfig, seed: int, global_batch: int,
                    tokens: TokenLayout | None, losses: list[float], log: DriftLog, tp: int
                    ) -> dict[str, Any]:
    """Rank 0: the float64 reference run beside the run's losses, parameters and iteration
    0's gradients."""
    ref = Reference(cfg, seed, opt, global_batch, np.float64, tokens)
    rows, grads = [], None
    for it, loss in enumerate(losses):
        exact = ref.train_step(it)
        if it == log.first_grads_iteration and log.first_grads is not None:
            grads = _stats(tensor_errors(log.first_grads, ref.last_grads, cfg, tp))
        p = _stats(tensor_errors(log.per_iteration[it], ref.params, cfg, tp)) \
            if it in log.per_iteration else _stats([])
        rows.append({"iteration": it, "loss": loss, "loss_fp64": exact,
                     "loss_rel_diff": abs(loss - exact) / abs(exact) if exact else None,
                     "param_rel_err_max": p["max"], "param_rel_err_median": p["median"],
                     "worst_param": p["worst"]})
    return {"against": "float64 reference", "iterations": rows, "first_grads": grads,
            "first_grads_iteration": log.first_grads_iteration}

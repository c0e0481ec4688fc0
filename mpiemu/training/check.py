"""Is the sharded model right? Every rank's shards against the one-process reference.

Rank 0 gathers each rank's parameter shards (host-side, outside emulated time), trains the
unsharded reference for the same iterations from the same seed and in the same precision,
cuts the reference's parameters the way each rank holds them and reports the largest
relative error (max |ours - ref| / max |ref| per tensor) and the largest relative loss
difference.

Below fp64 the parameters are a poor test: Adam divides each gradient by its own running
size, so a weight whose gradient is rounding noise moves by about lr a step in a direction
the rounding decides, and the sharded run rounds in other orders than the reference (each
TP rank's partial sum, micro-batch by micro-batch, sequence-major rows). There the check
judges the first iteration's gradients, reduced as the optimizer receives them, tensor by
tensor, and the losses; the parameters' error is reported beside them.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import NamedTuple

import numpy as np
from mpi4py import MPI

from ..model.config import ModelConfig
from ..precision.fp8_gemm import Fp8Gemm
from ..precision.matmul import PrecisionGemm
from .config import OptimizerConfig
from .reference import Reference
from .reference_moe import TokenLayout
from ..model.tensor_parallel import ExpertPlace, shard_params


def judges_gradients(numeric_dtype: str) -> bool:
    """Whether the check judges the first iteration's gradients instead of the parameters
    (every precision below fp64, module docstring)."""
    return numeric_dtype != "fp64"


@dataclass(frozen=True)
class ReferenceCheck:
    """Worst disagreement of any rank's shards and of the losses with the reference."""

    param_rel_err: float
    loss_rel_err: float
    worst_param: str
    tolerance: float
    ranks: int
    grad_rel_err: float | None = None    # iteration 0's gradients, where they are judged
    worst_grad: str = "-"
    grad_median_rel_err: float | None = None     # the median tensor's
    grad_iteration: int = 0              # whose gradients (FP16: its first step taken)

    @property
    def passed(self) -> bool:
        judged = self.param_rel_err if self.grad_rel_err is None else self.grad_rel_err
        return judged <= self.tolerance and self.loss_rel_err <= self.tolerance

    def line(self) -> str:
        params = f"{self.param_rel_err:.2e} in parameters ({self.worst_param}"
        if self.grad_rel_err is None:
            what = f"max relative error {params}, {self.ranks} ranks)"
        else:
            what = (f"max relative error {self.grad_rel_err:.2e} in iteration "
                    f"{self.grad_iteration}'s gradients "
                    f"({self.worst_grad}, {self.ranks} ranks), {params}; not judged: Adam)")
        return (f"reference check: {what}, {self.loss_rel_err:.2e} in losses; tolerance "
                f"{self.tolerance:.3g}: {'PASS' if self.passed else 'FAIL'}")

    def as_dict(self) -> dict[str, object]:
        return asdict(self) | {"passed": self.passed}


def rel_err(ours: np.ndarray, ref: np.ndarray) -> float:
    """max |ours - ref| / max |ref| (absolute where the reference is all zero); infinite
    when either holds a NaN or an inf, so a diverged run can never pass."""
    if not (np.all(np.isfinite(ours)) and np.all(np.isfinite(ref))):
        return float("inf")
    scale = float(np.abs(ref).max()) if ref.size else 0.0
    diff = float(np.abs(ours - ref).max()) if ref.size else 0.0
    return diff / scale if scale > 0 else diff


Place = tuple[int, ExpertPlace]                         # (TP rank, expert place)
Shards = list[tuple[Place, dict[str, np.ndarray]]]      # every rank's tensors, by place


def tensor_errors(ours: Shards, whole: dict[str, np.ndarray], cfg: ModelConfig, tp: int
                  ) -> list[tuple[float, str]]:
    """(relative error, name) of each rank's tensor against the whole tensors cut as that
    rank holds them."""
    cuts = {place: shard_params(whole, cfg, tp, *place) for place in {p for p, _ in ours}}
    return [(rel_err(t, cuts[place][n]), n) for place, tensors in ours for n, t in tensors.items()]



class RefPrecision(NamedTuple):
    """The reference's precision: its GEMMs, its layers' FP8 GEMMs under a recipe and the
    samples of each of the step's micro-batches they run in turn (`Reference`)."""

    gemm: PrecisionGemm = PrecisionGemm("fp32")
    fp8: Fp8Gemm | None = None
    micro_sets: list[np.ndarray] | None = None


def check_against_reference(world: MPI.Comm, cfg: ModelConfig, opt: OptimizerConfig,
                            seed: int, global_batch: int, tp: int, place: Place,
                            params: dict[str, np.ndarray], losses: list[float],
                            np_dtype: type, tolerance: float,
                            tokens: TokenLayout | None = None,
                            precision: RefPrecision = RefPrecision(),
                            first_grads: dict[str, np.ndarray] | None = None,
                            first_grads_iteration: int = 0) -> ReferenceCheck:
    """Collective over `world`: every rank's result is rank 0's verdict (`tokens`: how
    the run splits tokens among routing ranks; `place`: this rank's TP rank and expert
    place; `first_grads`:
    this rank's reduced gradients of iteration `first_grads_iteration` (0, or FP16's first
    step not skipped), judged instead of the parameters)."""
    shards = world.gather((place, params, first_grads), root=0)
    result = None
    if world.Get_rank() == 0:
        assert shards is not None
        ref = Reference(cfg, seed, opt, global_batch, np_dtype, tokens, *precision)
        ref_losses, ref_grads = [], {}
        for it in range(len(losses)):
            ref_losses.append(ref.train_step(it))
            if it == first_grads_iteration:
                ref_grads = ref.last_grads
        worst, where = max(tensor_errors([(pl, p) for pl, p, _ in shards], ref.params, cfg,
                                         tp), default=(0.0, "-"))
        g_worst, g_where, g_median = None, "-", None
        if first_grads is not None:
            errs = tensor_errors([(pl, g) for pl, _, g in shards], ref_grads, cfg, tp)
            g_worst, g_where = max(errs, default=(float("inf"), "no gradients"))
            g_median = float(np.median([e for e, _ in errs])) if errs else None
        loss_err = max((abs(a - b) / abs(b) if np.isfinite(a) and np.isfinite(b) and b
                        else (0.0 if a == b == 0 else float("inf"))
                        for a, b in zip(losses, ref_losses)), default=0.0)
        result = ReferenceCheck(worst, loss_err, where, tolerance, world.Get_size(), g_worst,
                                g_where, g_median, first_grads_iteration)
    return world.bcast(result, root=0)

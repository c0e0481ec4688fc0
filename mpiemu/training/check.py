"""Is the sharded model right? Every rank's shards against the one-process reference.

Rank 0 gathers each rank's parameter shards (host-side, outside emulated time), trains the
unsharded reference for the same iterations from the same seed, cuts the reference's
parameters the way each rank holds them and reports the largest relative error
(max |ours - ref| / max |ref| per tensor) and the largest relative loss difference.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from mpi4py import MPI

from ..model.config import ModelConfig
from .config import OptimizerConfig
from .reference import Reference
from .reference_moe import TokenLayout
from ..model.tensor_parallel import shard_params


@dataclass(frozen=True)
class ReferenceCheck:
    """Worst disagreement of any rank's shards and of the losses with the reference."""

    param_rel_err: float
    loss_rel_err: float
    worst_param: str
    tolerance: float
    ranks: int

    @property
    def passed(self) -> bool:
        return self.param_rel_err <= self.tolerance and self.loss_rel_err <= self.tolerance

    def line(self) -> str:
        return (f"reference check: max relative error {self.param_rel_err:.2e} in parameters "
                f"({self.worst_param}, {self.ranks} ranks), {self.loss_rel_err:.2e} in losses; "
                f"tolerance {self.tolerance:.0e}: {'PASS' if self.passed else 'FAIL'}")

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


def check_against_reference(world: MPI.Comm, cfg: ModelConfig, opt: OptimizerConfig,
                            seed: int, global_batch: int, tp: int, tp_rank: int,
                            params: dict[str, np.ndarray], losses: list[float],
                            np_dtype: type, tolerance: float,
                            tokens: TokenLayout | None = None, ep: int = 1,
                            ep_rank: int = 0) -> ReferenceCheck:
    """Collective over `world`: every rank's result is rank 0's verdict (`tokens`: how
    the run splits tokens among routing ranks; `ep`: experts split over EP)."""
    shards = world.gather(((tp_rank, ep_rank), params), root=0)
    result = None
    if world.Get_rank() == 0:
        ref = Reference(cfg, seed, opt, global_batch, np_dtype, tokens)
        ref_losses = [ref.train_step(it) for it in range(len(losses))]
        cuts = {(r, e): shard_params(ref.params, cfg, tp, r, ep, e)
                for r in range(tp) for e in range(ep)}
        worst, where = 0.0, "-"
        for place, p in shards:                                   # type: ignore[union-attr]
            for name, ours in p.items():
                e = rel_err(ours, cuts[place][name])
                if e > worst:
                    worst, where = e, name
        loss_err = max((abs(a - b) / abs(b) if np.isfinite(a) and np.isfinite(b) and b
                        else (0.0 if a == b == 0 else float("inf"))
                        for a, b in zip(losses, ref_losses)), default=0.0)
        result = ReferenceCheck(worst, loss_err, where, tolerance, world.Get_size())
    return world.bcast(result, root=0)

"""The optimizer of a training run: Adam or LAMB and how their update runs (no MPI, no arrays)."""
from __future__ import annotations

from dataclasses import dataclass

from ..model.config import FieldError, braces

CLIP_EPS = 1e-6   # Megatron: clip_coeff = max_norm / (total_norm + 1e-6)
OPTIMIZERS = ("adam", "lamb")
DDP_IMPLS = ("core", "local")      # Megatron core's bucketed DDP; Megatron-LM 2022's local DDP
UPDATE_UNITS = ("gpu", "nmc")     # where the update runs (thesis ch. 6: near-memory compute)


@dataclass(frozen=True)
class OptimizerConfig:
    """Adam (decoupled weight decay, as Megatron) or LAMB (You et al. 2020), fp32 states.

    Weight decay applies to matrices only (not biases or LayerNorm), as in Megatron and BERT.
    `clip_grad_norm` > 0 scales gradients by min(1, clip / (||g|| + 1e-6)) (Megatron).
    """

    name: str = "adam"
    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01
    clip_grad_norm: float = 1.0
    on: str = "gpu"                  # "nmc": the update on the DRAM banks' ALUs (devices/nmc.py)
    distributed: bool = False        # ZeRO-1: states and master weights sharded over DP
    overlap_param_gather: bool = False   # distributed: gather parameters under next forward

    def __post_init__(self) -> None:
        if self.name not in OPTIMIZERS:
            raise FieldError("optimizer.name", self.name, f"choose one of {braces(OPTIMIZERS)}")
        if self.on not in UPDATE_UNITS:
            raise FieldError("optimizer.on", self.on, f"choose one of {braces(UPDATE_UNITS)}")
        for key in ("lr", "eps"):
            if getattr(self, key) <= 0:
                raise FieldError(f"optimizer.{key}", getattr(self, key), "must be > 0")
        for key in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise FieldError(f"optimizer.{key}", getattr(self, key), "must be in [0, 1)")
        for key in ("weight_decay", "clip_grad_norm"):
            if getattr(self, key) < 0:
                raise FieldError(f"optimizer.{key}", getattr(self, key), "must be >= 0")
        if self.distributed and self.name != "adam":
            raise FieldError("optimizer.distributed", True, "needs optimizer.name='adam' "
                             "(LAMB's per-tensor trust ratio is not sharded; Megatron-LM's "
                             "distributed optimizer is Adam's)")
        if self.distributed and self.on != "gpu":
            raise FieldError("optimizer.distributed", True, "needs optimizer.on='gpu'")
        if self.overlap_param_gather and not self.distributed:
            raise FieldError("optimizer.overlap_param_gather", True,
                             "needs optimizer.distributed=true")

    @property
    def needs_global_norm(self) -> bool:
        return self.clip_grad_norm > 0

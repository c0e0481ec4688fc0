"""The optimizer of a training run: Adam or LAMB and how their update runs (no MPI, no arrays)."""
from __future__ import annotations

from dataclasses import dataclass

from ..model.config import FieldError, braces
from ..precision.loss_scale import DynamicLossScaler

CLIP_EPS = 1e-6   # Megatron: clip_coeff = max_norm / (total_norm + 1e-6)
OPTIMIZERS = ("adam", "lamb")
DDP_IMPLS = ("core", "local")      # Megatron core's bucketed DDP; Megatron-LM 2022's local DDP
ZERO_STAGES = (0, 1, 2, 3)
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
    # ZeRO stage over the DP (x CP) group (Rajbhandari et al. 2020, 5): 1 shards the fp32
    # master weights and Adam states (Megatron-LM's distributed optimizer), 2 the gradients
    # too (reduce-scattered per micro-batch), 3 the parameters too (FSDP: gathered per layer)
    zero: int = 0
    overlap_param_gather: bool = False   # ZeRO-1/2: gather parameters under next forward
    prefetch: bool = True            # ZeRO-3: the next layer's gather under this one's compute
    reshard_after_forward: bool = True   # ZeRO-3: free a layer's parameters after forward
    # ZeRO-2 / 3: the ranks of DP x CP one shard group spans (0: all). Hybrid sharding
    # (PyTorch HSDP): sharded inside each group of that many consecutive ranks (a node's),
    # replicated across the groups, gradients reduce-scattered inside and all-reduced across
    shard_group: int = 0
    # ZeRO >= 1 under an [fp8] recipe: the layers' linear weights held in FP8 and
    # all-gathered as FP8 bytes, cast from the fp32 master shards (Megatron-Core's
    # DistributedDataParallelConfig.fp8_param_gather, TE's quantized_model_init)
    fp8_param_gather: bool = False
    # FP16 loss scaling (Megatron-Core OptimizerConfig; `precision.loss_scale`), for
    # run.numeric_dtype = "fp16": 0 a dynamic scale from initial_loss_scale, else this one
    loss_scale: float = 0.0
    initial_loss_scale: float = 2.0 ** 32
    min_loss_scale: float = 1.0
    loss_scale_window: int = 1000
    hysteresis: int = 2

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
        if self.zero not in ZERO_STAGES:
            raise FieldError("optimizer.zero", self.zero, f"choose one of {braces(ZERO_STAGES)}")
        if self.distributed and self.name != "adam":
            raise FieldError("optimizer.zero", self.zero, "needs optimizer.name='adam' "
                             "(LAMB's per-tensor trust ratio is not sharded; Megatron-LM's "
                             "distributed optimizer is Adam's)")
        if self.distributed and self.on != "gpu":
            raise FieldError("optimizer.zero", self.zero, "needs optimizer.on='gpu'")
        if self.overlap_param_gather and self.zero not in (1, 2):
            raise FieldError("optimizer.overlap_param_gather", True,
                             "needs optimizer.zero = 1 or 2 (ZeRO-3 gathers every layer "
                             "before its forward anyway)")
        if self.shard_group < 0 or (self.shard_group and self.zero < 2):
            raise FieldError("optimizer.shard_group", self.shard_group, "0 (shard over all of "
                             "DP x CP), or > 0 with optimizer.zero = 2 or 3 (hybrid sharding)")
        for key in ("initial_loss_scale", "min_loss_scale"):
            if not getattr(self, key) > 0:
                raise FieldError(f"optimizer.{key}", getattr(self, key), "must be > 0")
        if self.loss_scale < 0:
            raise FieldError("optimizer.loss_scale", self.loss_scale,
                             "0 (dynamic) or a constant scale > 0")
        for key in ("loss_scale_window", "hysteresis"):
            if getattr(self, key) < 1:
                raise FieldError(f"optimizer.{key}", getattr(self, key), "an integer >= 1")
        if self.fp8_param_gather and self.zero < 1:
            raise FieldError("optimizer.fp8_param_gather", True, "false with optimizer.zero "
                             "= 0 (only the distributed optimizer and FSDP gather parameters)")
        for key in ("prefetch", "reshard_after_forward"):
            if not getattr(self, key) and self.zero != 3:
                raise FieldError(f"optimizer.{key}", False, "applies to optimizer.zero = 3 "
                                 "only (the parameters sharded)")

    def loss_scaler(self) -> DynamicLossScaler:
        """FP16's scaler: Megatron's dynamic one, or a constant scale that never moves."""
        if self.loss_scale > 0:
            return DynamicLossScaler(self.loss_scale, self.loss_scale, 1.0, 1.0,
                                     self.loss_scale_window, self.hysteresis)
        return DynamicLossScaler(self.initial_loss_scale, self.min_loss_scale, 2.0, 0.5,
                                 self.loss_scale_window, self.hysteresis)

    @property
    def distributed(self) -> bool:
        """Optimizer states sharded over DP (ZeRO-1 and above)."""
        return self.zero >= 1

    @property
    def shards_grads(self) -> bool:
        """Gradients reduce-scattered per micro-batch and kept as shards (ZeRO-2, 3)."""
        return self.zero >= 2

    @property
    def shards_params(self) -> bool:
        """Parameters sharded, each layer gathered when used (ZeRO-3 / FSDP)."""
        return self.zero == 3

    @property
    def needs_global_norm(self) -> bool:
        return self.clip_grad_norm > 0

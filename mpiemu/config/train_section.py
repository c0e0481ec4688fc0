"""Workload sections of the transformer training kind: [model], [train], [optimizer]."""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path

from ..devices.kernels import MODES as KERNEL_MODES
from ..model.config import (ACTIVATIONS, ATTENTION_ALIASES, ATTENTIONS, MASKS, NORM_KINDS, NORMS,
                            POSITIONS, FieldError, ModelConfig)
from ..model.executor import KernelOptions
from ..training.config import DDP_IMPLS, OPTIMIZERS, OptimizerConfig
from ..model.stage import RECOMPUTE
from ..model.presets import ModelPresetError, list_model_presets, load_model_preset
from .errors import ConfigError

MEMORY_CHECKS = ("error", "warn")


LATENT = ("q_lora_rank", "kv_lora_rank", "qk_rope_dim", "v_head_dim")   # MLA's sizes


@dataclass(frozen=True)
class ModelSection:
    """Which transformer: a preset name (mpiemu/model/presets) plus optional overrides.

    Sizes of 0, empty strings, rates of -1 and unset switches keep the preset's value.
    """

    preset: str = "tiny"
    hidden: int = 0
    layers: int = 0
    heads: int = 0
    ffn_hidden: int = 0
    vocab: int = 0
    seq_len: int = 0
    norm: str = ""                   # "pre" (GPT) or "post" (BERT)
    attention_mask: str = ""         # "causal" or "bidirectional"
    attention: str = ""              # "baseline", "sd", "sdf" or "flash" (docs/kernels.md)
    attention_block: int = 0
    hidden_dropout: float = -1.0
    attention_dropout: float = -1.0
    norm_kind: str = ""              # "layernorm" or "rmsnorm"
    activation: str = ""             # "gelu" or "swiglu"
    position: str = ""               # "learned" or "rope"
    kv_heads: int = -1               # 0: as many as heads (multi-head); -1: the preset's
    bias: bool | None = None
    tied_embeddings: bool | None = None
    rope_theta: float = 0.0
    rope_scaling: float = -1.0       # 0: no scaling; -1: the preset's
    kv_channels: int = -1            # a head's width; 0: hidden // heads; -1: the preset's
    qk_norm: bool | None = None      # RMSNorm of each head's q and k (Qwen3)
    # multi-head latent attention (DeepSeek-V3; docs/training.md); -1: the preset's
    q_lora_rank: int = -1
    kv_lora_rank: int = -1           # > 0: MLA; 0: none
    qk_rope_dim: int = -1
    v_head_dim: int = -1

    def __post_init__(self) -> None:
        if not Path(self.preset).suffix.endswith("toml") \
                and self.preset not in list_model_presets():
            raise ConfigError("model.preset", self.preset, list_model_presets())
        for key in ("hidden", "layers", "heads", "ffn_hidden", "vocab", "seq_len",
                    "attention_block"):
            if getattr(self, key) < 0:
                raise ConfigError(f"model.{key}", getattr(self, key),
                                  "an integer >= 1 (or 0 for the preset's value)")
        for key, allowed in (("norm", NORMS), ("attention_mask", MASKS),
                             ("attention", ATTENTIONS), ("norm_kind", NORM_KINDS),
                             ("activation", ACTIVATIONS), ("position", POSITIONS)):
            v = getattr(self, key)
            if v and v not in allowed and not (key == "attention" and v in ATTENTION_ALIASES):
                raise ConfigError(f"model.{key}", v, allowed)
        for key in ("hidden_dropout", "attention_dropout"):
            v = getattr(self, key)
            if v != -1.0 and not 0.0 <= v < 1.0:
                raise ConfigError(f"model.{key}", v, "a rate in [0, 1) (or -1 for the preset's)")
        if self.kv_channels < -1:
            raise ConfigError("model.kv_channels", self.kv_channels, "an integer >= 1 (0: "
                              "hidden // heads, -1: the preset's)")
        for key in LATENT:
            if getattr(self, key) < -1:
                raise ConfigError(f"model.{key}", getattr(self, key), "an integer >= 0 (-1: "
                                  "the preset's)")

    def resolve(self) -> ModelConfig:
        """The preset's model with this section's overrides applied (unpadded vocabulary)."""
        try:
            base = load_model_preset(self.preset).config
        except ModelPresetError as exc:
            raise ConfigError("model.preset", self.preset, str(exc)) from None
        changes = {k: getattr(self, k) for k in
                   ("hidden", "layers", "heads", "ffn_hidden", "vocab", "seq_len",
                    "attention_block") if getattr(self, k)}
        changes.update({k: getattr(self, k) for k in ("norm", "attention_mask", "attention",
                                                      "norm_kind", "activation", "position")
                        if getattr(self, k)})
        changes.update({k: getattr(self, k) for k in ("hidden_dropout", "attention_dropout",
                                                      "rope_scaling", "kv_heads",
                                                      "kv_channels", *LATENT)
                        if getattr(self, k) != -1})
        changes.update({k: getattr(self, k) for k in ("bias", "tied_embeddings", "qk_norm")
                        if getattr(self, k) is not None})
        if self.rope_theta:
            changes["rope_theta"] = self.rope_theta
        try:
            return replace(base, **changes)
        except FieldError as exc:
            raise ConfigError(exc.field, exc.value, exc.allowed) from None

    def preset_global_batch(self) -> int:
        return load_model_preset(self.preset).global_batch


@dataclass(frozen=True)
class TrainSection:
    """Batching, DP bucketing, memory check and the optional reference check."""

    global_batch: int = 0            # sequences per iteration over all DP ranks (0: preset's)
    dp_bucket_MiB: float = 25.0      # emulated gradient bytes per DP all-reduce bucket
    memory_check: str = "error"      # a configuration that does not fit: "error" or "warn"
    check_reference: bool = False    # rank 0 re-runs the one-process reference and compares
    reference_rtol: float = 0.0      # 0: by run.numeric_dtype (runner.train_setup)
    kernels: str = "fused"           # non-GEMM kernels: "unfused" (PyTorch) or "fused" (Megatron)
    fuse_epilogues: bool = False     # FC-1 bias + GeLU in the GEMM epilogues (cuBLASLt)
    micro_batch: int = 0             # sequences per micro-batch (0: global_batch / dp, one)
    recompute: str = "none"          # "selective" (attention core) or "full" (whole layers)
    tp_comm_async: bool = True       # input-gradient reduction under the wgrad GEMM (Megatron)
    overlap_grad_reduce: bool = True     # DP buckets reduced during backward (else after it)
    grad_accumulation_fusion: bool = True    # wgrad GEMMs add into Megatron's main_grad
    ddp: str = "core"                # DP reduction: Megatron core's buckets, or 2022's "local"

    def __post_init__(self) -> None:
        if self.global_batch < 0:
            raise ConfigError("train.global_batch", self.global_batch,
                              "an integer >= 1 (or 0 for the preset's)")
        if self.dp_bucket_MiB < 0:
            raise ConfigError("train.dp_bucket_MiB", self.dp_bucket_MiB, "a size >= 0")
        if self.memory_check not in MEMORY_CHECKS:
            raise ConfigError("train.memory_check", self.memory_check, MEMORY_CHECKS)
        if self.reference_rtol < 0:
            raise ConfigError("train.reference_rtol", self.reference_rtol, "a tolerance >= 0")
        if self.micro_batch < 0:
            raise ConfigError("train.micro_batch", self.micro_batch,
                              "an integer >= 1 (or 0 for one micro-batch per DP rank)")
        if self.recompute not in RECOMPUTE:
            raise ConfigError("train.recompute", self.recompute, RECOMPUTE)
        if self.kernels not in KERNEL_MODES:
            raise ConfigError("train.kernels", self.kernels, KERNEL_MODES)
        if self.ddp not in DDP_IMPLS:
            raise ConfigError("train.ddp", self.ddp, DDP_IMPLS)
        if self.ddp == "local" and self.overlap_grad_reduce:
            raise ConfigError("train.overlap_grad_reduce", True,
                              "false with train.ddp = 'local' (its one reduction runs after "
                              "backward)")

    def kernel_options(self) -> KernelOptions:
        return KernelOptions(self.kernels, self.fuse_epilogues)


@dataclass(frozen=True)
class OptimizerSection(OptimizerConfig):
    """[optimizer]: Adam or LAMB and their hyper-parameters (fp32 master weights and states);
    the fields and checks are `model.config.OptimizerConfig`'s, errors become ConfigErrors."""

    def __post_init__(self) -> None:
        if self.name not in OPTIMIZERS:
            raise ConfigError("optimizer.name", self.name, OPTIMIZERS)
        try:
            super().__post_init__()
        except FieldError as exc:
            raise ConfigError(exc.field, exc.value, exc.allowed) from None

    def to_config(self) -> OptimizerConfig:
        return OptimizerConfig(**{f.name: getattr(self, f.name) for f in fields(self)})

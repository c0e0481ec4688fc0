"""A Mixture-of-Experts layer's architecture and its balancing losses (no MPI, no arrays).

Names follow Megatron-Core's TransformerConfig (`megatron/core/transformer/
transformer_config.py`, the `moe_*` fields): `experts` = num_moe_experts, `top_k` =
moe_router_topk, `expert_ffn` = moe_ffn_hidden_size, `shared_ffn` =
moe_shared_expert_intermediate_size, `score` = moe_router_score_function, `topk_scale` =
moe_router_topk_scaling_factor, `groups` / `group_top_k` = moe_router_num_groups /
moe_router_group_topk, `aux_loss_coeff`, `z_loss_coeff`, `expert_bias` /
`bias_update_rate` (DeepSeek-V3's auxiliary-loss-free balancing, 2412.19437 2.1.2),
`capacity_factor` = moe_expert_capacity_factor (0: dropless).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

SCORES = ("softmax", "sigmoid")
# global: Switch / GShard over a micro-batch; seq: DeepSeek-V3's sequence-wise loss (2.1.2,
# Eq. 17-20), averaged over the micro-batch's sequences
AUX_LOSSES = ("none", "global", "seq")
MAX_EXPERTS = 1 << 12


class MoeFieldError(ValueError):
    """A setting out of range: names the field, the value and what is allowed."""

    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field, self.value, self.allowed = field, value, allowed
        super().__init__(f"{field}={value!r}: {allowed}")


@dataclass(frozen=True)
class MoeConfig:
    """The MoE layers of a model: every layer from `dense_layers` on replaces its MLP by
    `experts` SwiGLU (or GeLU) experts of width `expert_ffn`, `top_k` of them per token,
    plus shared experts of total width `shared_ffn` that every token passes (DeepSeek)."""

    experts: int
    top_k: int
    expert_ffn: int
    shared_ffn: int = 0
    score: str = "softmax"
    pre_softmax: bool = True         # softmax over all experts, then top-k (else top-k logits)
    normalize: bool = True           # the k weights divided by their sum
    topk_scale: float = 1.0
    groups: int = 1                  # experts in groups; top-k within the best group_top_k
    group_top_k: int = 1
    dense_layers: int = 0            # the first layers keep a dense MLP
    dense_ffn: int = 0               # ... of this width (0: model.ffn_hidden)
    aux_loss: str = "global"
    aux_loss_coeff: float = 0.0
    z_loss_coeff: float = 0.0
    expert_bias: bool = False
    bias_update_rate: float = 1e-3
    capacity_factor: float = 0.0

    def __post_init__(self) -> None:
        if not 1 <= self.experts <= MAX_EXPERTS:
            raise MoeFieldError("moe.experts", self.experts, f"must be in 1..{MAX_EXPERTS}")
        if not 1 <= self.top_k <= self.experts:
            raise MoeFieldError("moe.top_k", self.top_k,
                                f"must be in 1..moe.experts={self.experts}")
        if self.expert_ffn < 1 or self.shared_ffn < 0 or self.dense_ffn < 0:
            bad = ("moe.expert_ffn", self.expert_ffn) if self.expert_ffn < 1 else \
                ("moe.shared_ffn", self.shared_ffn) if self.shared_ffn < 0 else \
                ("moe.dense_ffn", self.dense_ffn)
            raise MoeFieldError(*bad, "must be >= 1 (expert_ffn) or >= 0")
        for key, allowed in (("score", SCORES), ("aux_loss", AUX_LOSSES)):
            if getattr(self, key) not in allowed:
                raise MoeFieldError(f"moe.{key}", getattr(self, key),
                                    f"choose one of {{{', '.join(allowed)}}}")
        self._check_groups()
        for key in ("aux_loss_coeff", "z_loss_coeff", "bias_update_rate"):
            if not 0.0 <= getattr(self, key) < 1e3:
                raise MoeFieldError(f"moe.{key}", getattr(self, key), "must be in [0, 1000)")
        if not 0.0 < self.topk_scale < 1e3:
            raise MoeFieldError("moe.topk_scale", self.topk_scale, "must be in (0, 1000)")
        if not (self.capacity_factor == 0.0 or 0.0 < self.capacity_factor <= self.experts):
            raise MoeFieldError("moe.capacity_factor", self.capacity_factor,
                                f"must be > 0 and <= moe.experts={self.experts} "
                                "(or 0: dropless)")
        if self.dense_layers < 0:
            raise MoeFieldError("moe.dense_layers", self.dense_layers, "must be >= 0")

    def _check_groups(self) -> None:
        """Group-limited routing (DeepSeek-V3's node-limited routing): the groups divide the
        experts, and the chosen groups hold at least top_k experts."""
        if self.groups < 1 or self.experts % self.groups:
            raise MoeFieldError("moe.groups", self.groups,
                                f"must divide moe.experts={self.experts}")
        per = self.experts // self.groups
        if not 1 <= self.group_top_k <= self.groups or self.group_top_k * per < self.top_k:
            raise MoeFieldError("moe.group_top_k", self.group_top_k,
                                f"must be in 1..moe.groups={self.groups} with group_top_k x "
                                f"{per} experts per group >= moe.top_k={self.top_k}")

    def is_moe(self, layer: int) -> bool:
        """Whether layer `layer` has experts (the first `dense_layers` are dense)."""
        return layer >= self.dense_layers

    def capacity(self, tokens: int) -> int:
        """Tokens an expert takes from a rank's `tokens` (Megatron-Core moe_utils.py
        `get_capacity`: ceil(tokens x top_k / experts x capacity_factor)); 0: dropless."""
        if self.capacity_factor == 0.0:
            return 0
        return math.ceil(tokens * self.top_k / self.experts * self.capacity_factor)

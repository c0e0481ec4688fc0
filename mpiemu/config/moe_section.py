"""The `[moe]` section: a model preset's experts overridden, and where a run's token counts
come from (`model.moe.tokens`)."""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..model.config import ModelConfig
from ..model.moe.config import AUX_LOSSES, SCORES, MoeFieldError
from ..model.moe.tokens import SOURCES
from .errors import ConfigError

DISPATCHERS = ("alltoall", "allgather")
SIZES = ("experts", "top_k", "expert_ffn", "groups", "group_top_k")   # 0: the preset's
AMOUNTS = ("shared_ffn", "dense_layers", "capacity_factor", "aux_loss_coeff", "z_loss_coeff",
           "bias_update_rate", "topk_scale")                     # -1: the preset's


@dataclass(frozen=True)
class MoeSection:
    """Overrides of the preset's `[moe]` (sizes 0, amounts -1, empty strings and unset
    switches keep it) and the token source: "" takes the router's choices with numerics on
    and perfect balance without; "skew" draws them from a Zipf law of exponent `skew`."""

    experts: int = 0
    top_k: int = 0
    expert_ffn: int = 0
    groups: int = 0
    group_top_k: int = 0
    shared_ffn: int = -1
    dense_layers: int = -1
    capacity_factor: float = -1.0
    aux_loss_coeff: float = -1.0
    z_loss_coeff: float = -1.0
    bias_update_rate: float = -1.0
    topk_scale: float = -1.0
    expert_bias: bool | None = None
    pre_softmax: bool | None = None
    normalize: bool | None = None
    score: str = ""
    aux_loss: str = ""
    tokens: str = ""
    skew: float = 1.0
    trace: str = ""                  # a routing.npz to replay (tokens = "trace")
    dispatcher: str = "alltoall"     # Megatron-Core --moe-token-dispatcher-type
    shared_overlap: bool = False     # shared experts under the all-to-alls (its
                                     # --moe-shared-expert-overlap)
    # one micro-batch's all-to-alls under another's compute (Megatron-Core
    # --overlap-moe-expert-parallel-comm: the combined 1F1B schedule, docs/moe.md)
    overlap_ep_comm: bool = False

    def __post_init__(self) -> None:
        for key in SIZES:
            if getattr(self, key) < 0:
                raise ConfigError(f"moe.{key}", getattr(self, key),
                                  "an integer >= 1 (or 0 for the preset's)")
        for key, allowed in (("score", SCORES), ("aux_loss", AUX_LOSSES), ("tokens", SOURCES),
                             ("dispatcher", DISPATCHERS)):
            if getattr(self, key) and getattr(self, key) not in allowed:
                raise ConfigError(f"moe.{key}", getattr(self, key), allowed)
        if (self.tokens == "trace") != bool(self.trace):
            raise ConfigError("moe.trace" if self.trace else "moe.tokens", self.trace or
                              self.tokens, "a routing trace (routing.npz of an earlier run) is "
                              "given exactly when moe.tokens = 'trace'")
        if not 0.0 <= self.skew <= 16.0:
            raise ConfigError("moe.skew", self.skew, "a Zipf exponent in [0, 16]")

    @property
    def overrides(self) -> dict[str, object]:
        """The fields this section sets."""
        out: dict[str, object] = {k: getattr(self, k) for k in SIZES if getattr(self, k)}
        out.update({k: getattr(self, k) for k in AMOUNTS if getattr(self, k) != -1})
        out.update({k: getattr(self, k) for k in ("score", "aux_loss") if getattr(self, k)})
        out.update({k: getattr(self, k) for k in ("expert_bias", "pre_softmax", "normalize")
                    if getattr(self, k) is not None})
        return out

    def apply(self, cfg: ModelConfig) -> ModelConfig:
        """The model with these overrides on its experts (refused for a dense model)."""
        sets = self.overrides
        if not sets:
            return cfg
        if cfg.moe is None:
            key = next(iter(sets))
            raise ConfigError(f"moe.{key}", sets[key], f"model.preset={cfg.name!r} has no "
                              "experts; choose a preset with a [moe] table (mixtral-8x7b, "
                              "tiny-moe, ...)")
        try:
            return replace(cfg, moe=replace(cfg.moe, **sets))     # type: ignore[arg-type]
        except MoeFieldError as exc:
            raise ConfigError(exc.field, exc.value, exc.allowed) from None

    def source(self, numerics: bool) -> str:
        """Where token counts come from: the router with numerics, else `tokens`."""
        return self.tokens or ("router" if numerics else "balanced")

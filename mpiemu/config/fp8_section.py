"""Workload section [fp8]: Transformer Engine's FP8 training of the transformer layers'
linear GEMMs (Megatron-Core's `--fp8-recipe`, `--fp8-format`, `--fp8-margin`,
`--fp8-amax-history-len`, `--fp8-amax-compute-algo`, with Megatron-Core's defaults:
`transformer_config.py`, history 1, 'most_recent', margin 0; modern_training.md §7)."""
from __future__ import annotations

from dataclasses import dataclass

from ..precision.fp8_gemm import RECIPES, Fp8Recipe
from .errors import ConfigError

FORMATS = ("hybrid", "e4m3")
AMAX_ALGOS = ("most_recent", "max")


@dataclass(frozen=True)
class Fp8Section:
    """recipe: off, delayed (per-tensor scales from an amax history), current (per-tensor,
    the tensor's own amax) or block (1 x 128 / 128 x 128 tiles, DeepSeek-V3); format: hybrid
    (E4M3 forward, E5M2 gradients) or e4m3; the delayed recipe's history, its reduction and
    margin."""

    recipe: str = "off"
    format: str = "hybrid"
    amax_history_len: int = 1
    amax_compute_algo: str = "most_recent"
    margin: int = 0

    def __post_init__(self) -> None:
        if self.recipe not in ("off", *RECIPES):
            raise ConfigError("fp8.recipe", self.recipe, ("off", *RECIPES))
        if self.format not in FORMATS:
            raise ConfigError("fp8.format", self.format, FORMATS)
        if self.amax_history_len < 1:
            raise ConfigError("fp8.amax_history_len", self.amax_history_len,
                              "an integer >= 1 (steps of amax kept)")
        if self.amax_compute_algo not in AMAX_ALGOS:
            raise ConfigError("fp8.amax_compute_algo", self.amax_compute_algo, AMAX_ALGOS)
        if self.margin < 0:
            raise ConfigError("fp8.margin", self.margin, "an integer >= 0 (scale / 2**margin)")

    @property
    def on(self) -> bool:
        return self.recipe != "off"

    def to_recipe(self) -> Fp8Recipe | None:
        if not self.on:
            return None
        return Fp8Recipe(self.recipe, self.format, self.amax_history_len,
                         self.amax_compute_algo, self.margin)

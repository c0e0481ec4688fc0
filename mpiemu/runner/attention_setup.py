"""A training run's multi-head latent attention before it runs: what MLA does not combine
with yet, refused in one line (the field, the value, what is allowed)."""
from __future__ import annotations

from ..config.errors import ConfigError
from ..config.workload import Workload
from ..model.config import ModelConfig


def validate_latent(w: Workload, cfg: ModelConfig) -> None:
    """MLA (model.kv_lora_rank > 0) runs without context parallelism; under an FP8 recipe it
    is timed, its FP8 numerics not checked against the reference. (Sunway ranks refuse its
    rotary positions already.)"""
    if not cfg.mla:
        return
    if w.parallel.cp > 1:
        raise ConfigError("parallel.cp", w.parallel.cp, "1 with multi-head latent attention "
                          "(model.kv_lora_rank > 0): its context-parallel attention is not "
                          "modelled")
    if w.fp8.on and w.run.numerics == "on":
        raise ConfigError("fp8.recipe", w.fp8.recipe, "off with multi-head latent attention "
                          "and numerics on (its FP8 numerics are not modelled; its GEMMs are "
                          "timed in FP8 with run.numerics = 'off')")

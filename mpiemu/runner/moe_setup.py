"""A training run's experts before it runs: the model with `[moe]` applied, and every check
of expert parallelism and of where token counts come from (one line each: the field, the
value, what is allowed)."""
from __future__ import annotations

import numpy as np

from ..config.errors import ConfigError
from ..config.workload import Workload, resolve_device
from ..model.config import ModelConfig, braces, divisors
from ..model.moe.routing_trace import load
from ..training.reference_moe import TokenLayout


def model_of(w: Workload) -> ModelConfig:
    """The preset's model with `[model]` and `[moe]` overrides (unpadded vocabulary)."""
    return w.moe.apply(w.model.resolve())


def token_layout(w: Workload, micro_batch: int) -> TokenLayout | None:
    """How the sharded run splits a micro-batch's tokens among ranks (the reference routes
    each rank's tokens as that rank does); None for a dense model."""
    if model_of(w).moe is None:
        return None
    sp = w.parallel.sequence_parallel and w.parallel.tp > 1
    return TokenLayout(micro_batch, w.parallel.tp if sp else 1, w.parallel.cp)


def routing_trace(w: Workload, cfg: ModelConfig) -> np.ndarray | None:
    """The recorded choices `moe.tokens = "trace"` replays (refused in one line when the
    file is unreadable, damaged or of another model)."""
    if w.moe.tokens != "trace" or cfg.moe is None:
        return None
    try:
        return load(w.moe.trace, cfg.moe)
    except ValueError as exc:
        raise ConfigError("moe.trace", w.moe.trace, str(exc)) from None


def validate_moe(w: Workload, cfg: ModelConfig) -> None:
    """Experts split evenly over EP, EP regrouping a stage's ranks, SP with TP, the token
    source matching the numerics, and what expert parallelism does not combine with yet."""
    par, ep = w.parallel, w.parallel.ep
    if cfg.moe is None:
        for name in ("ep", "etp"):
            if getattr(par, name) > 1:
                raise ConfigError(f"parallel.{name}", getattr(par, name), "needs a model with "
                                  f"experts; model.preset={w.model.preset!r} has none (try "
                                  "tiny-moe or mixtral-8x7b)")
        return
    if cfg.moe.experts % ep:
        raise ConfigError("parallel.ep", ep, f"does not divide moe.experts={cfg.moe.experts}; "
                          f"choose ep in {braces(divisors(cfg.moe.experts))}")
    if cfg.moe.expert_ffn % par.etp:
        raise ConfigError("parallel.etp", par.etp, f"does not divide the experts' FFN width "
                          f"moe.expert_ffn={cfg.moe.expert_ffn}; choose etp in "
                          f"{braces(divisors(cfg.moe.expert_ffn))}")
    if par.tp > 1 and not par.sequence_parallel:
        raise ConfigError("parallel.sequence_parallel", False, "must be true with experts and "
                          "parallel.tp > 1 (Megatron-Core requires it: each TP rank routes its "
                          "sequence shard)")
    _validate_source(w)
    routing_trace(w, cfg)
    if resolve_device(w).kind != "gpu":
        raise ConfigError("model.preset", w.model.preset, "experts run on GPU ranks; Sunway "
                          "ranks schedule SwFormer's dense GPT layer")
    if (ep > 1 or par.tp > 1 or par.etp > 1) and w.optimizer.zero > 1 and \
            (par.dp * par.cp == 1 or w.optimizer.shard_group):
        raise ConfigError("optimizer.zero", w.optimizer.zero, "0 or 1 with experts split "
                          "over parallel.ep or parallel.tp and parallel.dp x parallel.cp = 1 "
                          "or an optimizer.shard_group (ZeRO-2 / 3 shards the experts over "
                          "expert data parallelism and the rest over DP x CP, whole groups)")
    _validate_ep_overlap(w)
    if w.optimizer.name == "lamb":
        raise ConfigError("optimizer.name", "lamb", "experts train with 'adam' (LAMB's "
                          "per-tensor norms are not split by expert)")


def _validate_ep_overlap(w: Workload) -> None:
    """The combined 1F1B schedule: Megatron-Core's own conditions (transformer_config.py
    `__post_init__`, the overlap_moe_expert_parallel_comm checks, NVIDIA/Megatron-LM
    @d2c5e8b4: EP > 1, the all-to-all dispatcher, no full recomputation, no shared-expert
    overlap, virtual pipeline stages when PP > 1) and what is modelled (ZeRO-3's per-layer
    gathers are not interleaved)."""
    m, par = w.moe, w.parallel
    if not m.overlap_ep_comm:
        return
    why = "needs parallel.ep > 1" if par.ep == 1 else \
        "needs moe.dispatcher = 'alltoall'" if m.dispatcher != "alltoall" else \
        "excludes train.recompute = 'full'" if w.train.recompute == "full" else \
        "excludes moe.shared_overlap" if m.shared_overlap else \
        "needs parallel.schedule = 'interleaved' with parallel.pp > 1 (Megatron-Core: " \
        "virtual pipeline stages)" if par.pp > 1 and par.schedule != "interleaved" else \
        "is modelled with optimizer.zero <= 2" if w.optimizer.zero > 2 else ""
    if why:
        raise ConfigError("moe.overlap_ep_comm", True, f"false, or: the combined 1F1B "
                          f"schedule {why}")


def _validate_source(w: Workload) -> None:
    """The router decides with numerics on; a timing-only run needs another source."""
    tokens, on = w.moe.tokens, w.run.numerics == "on"
    if on and tokens not in ("", "router"):
        raise ConfigError("moe.tokens", tokens, "with run.numerics='on' the router's own "
                          "choices decide; set 'router' (or run.numerics='off')")
    if on and tokens == "trace":
        raise ConfigError("moe.tokens", tokens, "with run.numerics='on' the router's own "
                          "choices decide; replay a trace with run.numerics='off'")
    if not on and tokens == "router":
        raise ConfigError("moe.tokens", tokens, "needs run.numerics='on' (the router runs on "
                          "real values); timing only: 'balanced' or 'skew'")

"""Where a timing-only run's tokens per expert come from (`moe.tokens`).

With numerics on the router's own choices decide (`router`). Timing only: "balanced", every
expert receives the same share of each rank's n x k choices (what published benchmarks
force, Megatron-Core `moe_router_force_load_balancing`); "skew", each token's k experts
drawn without replacement with probabilities proportional to 1 / (rank of the expert)^s, the
ranking a seeded permutation per layer (Zipf's law with exponent s = `moe.skew`, drawn by
Gumbel top-k, seeded by run, iteration, layer, micro-batch and the rank's tokens); "trace",
the choices a numerics run recorded (`routing_trace`).
"""
from __future__ import annotations

import numpy as np

from ..seeded import generator
from .config import MoeConfig

SOURCES = ("router", "balanced", "skew", "trace")
SKEW_KEY = 7_771                  # separates these draws from the model's other seeds


def balanced(moe: MoeConfig, n: int) -> np.ndarray:
    """[E]: n x k choices spread evenly, the remainder on the first experts; capped."""
    total, E = n * moe.top_k, moe.experts
    c = np.full(E, total // E, np.int64)
    c[:total % E] += 1
    return _capped(c, moe, n)


def skewed(moe: MoeConfig, n: int, s: float, key: tuple[int, ...]) -> np.ndarray:
    """[E]: n tokens' k distinct experts drawn from a Zipf(s) law (see the module)."""
    seed, it, layer = key[:3]
    E = moe.experts
    ranking = generator(seed, SKEW_KEY, layer).permutation(E)
    logp = -s * np.log1p(ranking.astype(np.float64))                  # rank 0 is the hottest
    g = generator(seed, SKEW_KEY, *key[1:]).gumbel(size=(n, E))
    chosen = np.argsort(-(logp + g), axis=1, kind="stable")[:, :moe.top_k]
    return _capped(np.bincount(chosen.reshape(-1), minlength=E).astype(np.int64), moe, n)


def _capped(c: np.ndarray, moe: MoeConfig, n: int) -> np.ndarray:
    cap = moe.capacity(n)
    return np.minimum(c, cap) if cap else c

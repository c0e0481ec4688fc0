"""What every part of a transformer layer knows: its executor, the model, the rank's local
sizes, the layer's index and the names of its parameters and trace events."""
from __future__ import annotations

from typing import Any

import numpy as np

from .config import ModelConfig
from .dims import Dims
from .executor import Array, Executor, Ready
from .ops import (layernorm, layernorm_back, norm_cost, rmsnorm, rmsnorm_back, rope_frequencies,
                  rope_tables)

Params = dict[str, Array]
Cache = dict[str, Any]


def transposed(a: Array) -> Array:
    return None if a is None else a.T


def acc(G: Params, name: str, g: Array) -> None:
    """Accumulate a gradient over micro-batches (the first one is stored as computed)."""
    if g is None:
        return
    have = G.get(name)
    if have is None:
        G[name] = g
    else:
        have += g


def norm_names(cfg: ModelConfig, name: str) -> list[str]:
    """A norm's parameters: gain, and bias for LayerNorm (RMSNorm has none)."""
    return [name + x for x in ((".g", ".b") if cfg.norm_kind == "layernorm" else (".g",))]


def norm_forward(E: Executor, cfg: ModelConfig, name: str, label: str, x: Array, P: Params,
                 rows: int) -> tuple[Array, Any]:
    """LayerNorm or RMSNorm (`model.norm_kind`) of [rows, H] with parameters `name.*`:
    computed in fp32, its output stored in the numerics' dtype (`E.round`)."""
    cost = norm_cost(cfg.norm_kind, rows, cfg.hidden, E.e)
    if cfg.norm_kind == "rmsnorm":
        res = E.kernel(f"{label}.fwd", cost, rmsnorm, x, P[name + ".g"], cfg.layernorm_eps)
    else:
        res = E.kernel(f"{label}.fwd", cost, layernorm, x, P[name + ".g"], P[name + ".b"],
                       cfg.layernorm_eps)
    return (E.round(res[0]), res[1]) if res is not None else (None, None)


def norm_backward(E: Executor, cfg: ModelConfig, name: str, label: str, dy: Array, c: Any,
                  P: Params, G: Params, rows: int, ready: Ready) -> Array:
    """The norm's input gradient; its parameters' gradients accumulated and handed over."""
    cost = norm_cost(cfg.norm_kind, rows, cfg.hidden, E.e, backward=True)
    fn = rmsnorm_back if cfg.norm_kind == "rmsnorm" else layernorm_back
    res = E.kernel(f"{label}.bwd", cost, fn, dy, c, P[name + ".g"])
    names = norm_names(cfg, name)
    grads = res if res is not None else (None,) * (1 + len(names))
    for n, g in zip(names, grads[1:]):
        acc(G, n, g)
    ready(names)
    return E.round(grads[0])


class Block:
    """A part of layer `index` on one rank: parameters `layers.<index>.*`, events `l<index>.*`."""

    def __init__(self, ex: Executor, cfg: ModelConfig, dims: Dims, index: int,
                 recompute: str = "none", positions: np.ndarray | None = None,
                 cp_comm: str = "p2p") -> None:
        self.E, self.cfg, self.d, self.i = ex, cfg, dims, index
        # the sequence positions of the rank's rows (its two chunks under context
        # parallelism) and how its CP group runs attention (`context_parallel`)
        self.positions = np.arange(dims.seq) if positions is None else positions
        self.cp_comm = cp_comm
        self.p, self.tag = f"layers.{index}.", f"l{index}"
        # selective: the attention core's S x S tensors are dropped after forward and
        # recomputed in backward (Korthikanti et al. 2022, 4.2); flash keeps none anyway
        self.selective = recompute == "selective" and cfg.attention != "flash"

    def rope_rows(self, width: int, dtype: type) -> tuple[np.ndarray, np.ndarray]:
        """cos, sin [rows, width] of the rank's rows' positions over `width` rotated dims
        (sequence-first rows: each position B times)."""
        cfg, d = self.cfg, self.d
        freqs = rope_frequencies(width, cfg.rope_theta, cfg.rope_scaling,
                                 cfg.rope_low_freq_factor, cfg.rope_high_freq_factor,
                                 cfg.rope_original_max)
        cos, sin = rope_tables(freqs, self.positions, dtype)            # (S, width)
        return np.repeat(cos, d.batch, axis=0), np.repeat(sin, d.batch, axis=0)

    def biases(self, *names: str) -> list[str]:
        """These bias parameters of the layer, where the model has biases (Llama: none)."""
        return [self.p + n for n in names] if self.cfg.bias else []


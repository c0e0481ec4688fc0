"""Tensor parallelism's layout: which slice of which full parameter each TP rank holds
(Megatron, thesis 2.3.3).

Kinds: "rep" replicated (LayerNorm, biases after row-parallel GEMMs, positions), "qkv" the
rank's heads of Wq | Wk | Wv side by side (column-parallel), "col" a column slice (FC-1),
"row" a row slice (output projection, FC-2), "vocab" a row slice of the embedding table.
Under sequence parallelism a replicated parameter sees only the rank's sequence rows, so its
gradient is a partial sum that must be all-reduced over TP (Megatron's layernorm grads).
"""
from __future__ import annotations

import math
from typing import Iterator, NamedTuple, Sequence

import numpy as np

from .config import ModelConfig


class LocalParam(NamedTuple):
    """One parameter tensor of a TP rank and where it comes from."""

    name: str
    full: tuple[str, ...]      # reference parameter names it is cut from
    kind: str
    shape: tuple[int, ...]     # local shape
    layer: int                 # -1 for embedding / final norm

    @property
    def tp_split(self) -> bool:
        return self.kind != "rep"

    @property
    def sp_partial(self) -> bool:
        """Gradient is a partial sum over TP ranks under sequence parallelism."""
        return self.kind == "rep"

    @property
    def decay(self) -> bool:
        """Weight decay on matrices only (as the reference: not biases, not LayerNorm)."""
        return len(self.shape) == 2

    @property
    def size(self) -> int:
        return math.prod(self.shape)


def local_params(cfg: ModelConfig, tp: int) -> Iterator[LocalParam]:
    """Every parameter a TP rank holds, in forward order."""
    h, vl = cfg.hidden, cfg.padded_vocab // tp
    hl, fl = h // tp, cfg.ffn_hidden // tp
    yield LocalParam("wte", ("wte",), "vocab", (vl, h), -1)
    yield LocalParam("wpe", ("wpe",), "rep", (cfg.seq_len, h), -1)
    if cfg.norm == "post":
        yield from (LocalParam(f"lne.{x}", (f"lne.{x}",), "rep", (h,), -1) for x in "gb")
    for i in range(cfg.layers):
        p = f"layers.{i}."
        yield from (LocalParam(p + f"ln1.{x}", (p + f"ln1.{x}",), "rep", (h,), i) for x in "gb")
        yield LocalParam(p + "qkv.w", tuple(p + f"attn.w{x}" for x in "qkv"), "qkv",
                         (h, 3 * hl), i)
        yield LocalParam(p + "qkv.b", tuple(p + f"attn.b{x}" for x in "qkv"), "qkv", (3 * hl,), i)
        yield LocalParam(p + "proj.w", (p + "attn.wo",), "row", (hl, h), i)
        yield LocalParam(p + "proj.b", (p + "attn.bo",), "rep", (h,), i)
        yield from (LocalParam(p + f"ln2.{x}", (p + f"ln2.{x}",), "rep", (h,), i) for x in "gb")
        yield LocalParam(p + "fc1.w", (p + "mlp.w1",), "col", (h, fl), i)
        yield LocalParam(p + "fc1.b", (p + "mlp.b1",), "col", (fl,), i)
        yield LocalParam(p + "fc2.w", (p + "mlp.w2",), "row", (fl, h), i)
        yield LocalParam(p + "fc2.b", (p + "mlp.b2",), "rep", (h,), i)
    if cfg.norm == "pre":
        yield from (LocalParam(f"lnf.{x}", (f"lnf.{x}",), "rep", (h,), -1) for x in "gb")


def cut(lp: LocalParam, full: Sequence[np.ndarray], rank: int) -> np.ndarray:
    """TP rank `rank`'s slice of the full tensor(s) a local parameter is cut from."""
    if lp.kind == "rep":
        return full[0].copy()
    if lp.kind == "qkv":
        w = lp.shape[-1] // 3
        return np.concatenate([f[..., rank * w:(rank + 1) * w] for f in full], axis=-1)
    if lp.kind == "col":
        w = lp.shape[-1]
        return full[0][..., rank * w:(rank + 1) * w].copy()
    rows = lp.shape[0]                                   # "row" and "vocab"
    return full[0][rank * rows:(rank + 1) * rows].copy()


def shard_params(full: dict[str, np.ndarray], cfg: ModelConfig, tp: int, rank: int
                 ) -> dict[str, np.ndarray]:
    """The local tensors of TP rank `rank`, cut from the full (reference) parameters."""
    return {lp.name: cut(lp, [full[n] for n in lp.full], rank)
            for lp in local_params(cfg, tp)}


def unshard_params(by_rank: Sequence[dict[str, np.ndarray]], cfg: ModelConfig
                   ) -> dict[str, np.ndarray]:
    """Full (reference-named) parameters from every TP rank's local tensors, in rank order."""
    tp = len(by_rank)
    out: dict[str, np.ndarray] = {}
    for lp in local_params(cfg, tp):
        parts = [r[lp.name] for r in by_rank]
        if lp.kind == "rep":
            out[lp.full[0]] = parts[0].copy()
        elif lp.kind == "qkv":
            thirds = [np.split(p, 3, axis=-1) for p in parts]
            for j, name in enumerate(lp.full):
                out[name] = np.concatenate([t[j] for t in thirds], axis=-1)
        elif lp.kind == "col":
            out[lp.full[0]] = np.concatenate(parts, axis=-1)
        else:
            out[lp.full[0]] = np.concatenate(parts, axis=0)
    return out

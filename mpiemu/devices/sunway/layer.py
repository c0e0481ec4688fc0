"""The op graph of one Megatron-style GPT layer on a Sunway tensor-parallel rank, with costs.

Forward: LN -> QKV -> attention -> proj -> residual -> LN -> FC1 -> GeLU -> FC2 -> residual.
Backward: each linear gives a data-gradient GEMM (on the critical path) and a weight-gradient
GEMM ("W GEMM", SWF App. C) that only needs the layer's input and output gradient. The TP
all-reduces are not nodes here: they run on the links, outside the CG queue.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..specs import dtype_bytes
from .gemm import Predicate, default_micro_kernel, pad_free_tilings, tiled_cost
from .cost import AttnShape, SunwayCost
from .schedule import Op, Option

TOP_TILINGS = 8     # options kept per GEMM for the inter-op searches (SWF: ~50 valid tilings)


@dataclass(frozen=True)
class LayerShape:
    """One transformer layer as one TP rank sees it."""

    hidden: int
    heads: int
    head_dim: int
    ffn: int
    seq: int
    batch: int
    tp: int
    dtype: str = "fp32"

    def __post_init__(self) -> None:
        if self.heads % self.tp or self.ffn % self.tp or self.hidden % self.tp:
            raise ValueError(f"tp={self.tp} must divide heads={self.heads}, hidden="
                             f"{self.hidden} and ffn={self.ffn}")

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    @property
    def local_heads(self) -> int:
        """Heads per processor = N / TP (SWA 3.1)."""
        return self.heads // self.tp


def _gemm_op(cost: SunwayCost, name: str, m: int, n: int, k: int, dtype: str,
            deps: tuple[str, ...] = (), valid: Predicate = default_micro_kernel) -> Op:
    """A GEMM node whose options are its best pad-free tilings (tasks = tiles on one CG)."""
    costs = sorted((tiled_cost(cost.sw, m, n, k, dtype, 1, t)
                    for t in pad_free_tilings(m, n, k, dtype, cost.sw, valid)),
                   key=lambda c: c.time_s)
    if not costs:
        best = cost.gemm(m, n, k, dtype=dtype)
        costs = [best]
    opts = tuple(Option(f"{c.tiling.m_div}x{c.tiling.n_div}", (c.tile_s,) * c.tiling.tiles)
                 for c in costs[:TOP_TILINGS])
    return Op(name, "gemm", opts, deps, 2.0 * m * n * k)


def stream_op(cost: SunwayCost, name: str, nbytes_rw: tuple[float, float], flops: float,
              deps: tuple[str, ...] = ()) -> Op:
    """A memory-bound op over every CG: one task per CG, each a CG's share of the bytes."""
    t = cost.elementwise_s(*nbytes_rw, flops)
    return Op(name, "other", (Option("all-cgs", (t,) * cost.sw.core_groups),), deps, flops)


def attention_op(cost: SunwayCost, name: str, shape: LayerShape, pass_: str, kernel: str,
                 deps: tuple[str, ...] = ()) -> Op:
    """SWattention: one task per head (SWA 3.1); standard: its operators over every CG."""
    a = AttnShape(shape.batch, shape.local_heads, shape.seq, shape.head_dim, shape.dtype)
    att = cost.attention(pass_, a, kernel=kernel)
    tasks = att.tasks or (att.time_s,) * cost.sw.core_groups
    return Op(name, "attention", (Option(kernel, tasks),), deps, att.flops)


def layer_ops(cost: SunwayCost, shape: LayerShape, pass_: str,
              attention: str = "swattention", valid: Predicate = default_micro_kernel
              ) -> list[Op]:
    """The layer's ops in Megatron's execution order (a topological order)."""
    def gemm_op(cost: SunwayCost, name: str, m: int, n: int, k: int, dtype: str,
                deps: tuple[str, ...] = ()) -> Op:
        return _gemm_op(cost, name, m, n, k, dtype, deps, valid)

    e = dtype_bytes(shape.dtype)
    act = float(shape.tokens) * shape.hidden * e
    t, h, f, tp, dt = shape.tokens, shape.hidden, shape.ffn, shape.tp, shape.dtype
    ln, res = (act, act), (2 * act, act)
    if pass_ == "fwd":
        return [stream_op(cost, "ln1", ln, 8 * act / e),
                gemm_op(cost, "qkv", t, 3 * h // tp, h, dt, ("ln1",)),
                attention_op(cost, "attn", shape, "fwd", attention, ("qkv",)),
                gemm_op(cost, "proj", t, h, h // tp, dt, ("attn",)),
                stream_op(cost, "res1", res, act / e, ("proj",)),
                stream_op(cost, "ln2", ln, 8 * act / e, ("res1",)),
                gemm_op(cost, "fc1", t, f // tp, h, dt, ("ln2",)),
                stream_op(cost, "gelu", (act * f / h / tp,) * 2, 8 * act * f / h / tp / e,
                          ("fc1",)),
                gemm_op(cost, "fc2", t, h, f // tp, dt, ("gelu",)),
                stream_op(cost, "res2", res, act / e, ("fc2",))]
    if pass_ != "bwd":
        raise ValueError(f"pass={pass_!r}; choose 'fwd' or 'bwd'")
    return [stream_op(cost, "res2.b", res, act / e),
            gemm_op(cost, "fc2.d", t, f // tp, h, dt, ("res2.b",)),
            gemm_op(cost, "fc2.w", f // tp, h, t, dt, ("res2.b",)),
            stream_op(cost, "gelu.b", (2 * act * f / h / tp, act * f / h / tp),
                      8 * act * f / h / tp / e, ("fc2.d",)),
            gemm_op(cost, "fc1.d", t, h, f // tp, dt, ("gelu.b",)),
            gemm_op(cost, "fc1.w", h, f // tp, t, dt, ("gelu.b",)),
            stream_op(cost, "ln2.b", (2 * act, act), 10 * act / e, ("fc1.d",)),
            gemm_op(cost, "proj.d", t, h // tp, h, dt, ("ln2.b",)),
            gemm_op(cost, "proj.w", h // tp, h, t, dt, ("ln2.b",)),
            attention_op(cost, "attn.b", shape, "bwd", attention, ("proj.d",)),
            gemm_op(cost, "qkv.d", t, h, 3 * h // tp, dt, ("attn.b",)),
            gemm_op(cost, "qkv.w", h, 3 * h // tp, t, dt, ("attn.b",)),
            stream_op(cost, "ln1.b", (2 * act, act), 10 * act / e, ("qkv.d",))]

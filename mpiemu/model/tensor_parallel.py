"""Tensor parallelism's layout: which slice of which full parameter each TP rank holds
(Megatron, thesis 2.3.3).

Kinds: "rep" replicated (norms, biases after row-parallel GEMMs, positions), "qkv" the
rank's query heads and its KV heads of Wq | Wk | Wv side by side (column-parallel; KV heads
split as the query heads when there are at least as many as TP ranks), "qkv_grouped" the
rank's even slice of the fused QKV weight in Megatron-Core's grouped order (per KV group:
its query heads, its K, its V) when TP exceeds the KV heads: the K and V heads are then
replicated as activations by an all-gather of the QKV output (megatron/core/transformer/
attention.py, `get_query_key_value_tensors`), "col" a column slice (FC-1), "glu" the rank's
columns of the gate and of the up projection side by side (Megatron-Core's fused gated
`linear_fc1`: [gate_r | up_r]), "row" a row slice (output projection, FC-2), "vocab" a
row slice of the embedding table or the output layer, "expert_glu" / "expert_row" a routed
expert's FC-1 ([gate_r | up_r], as "glu") and FC-2 (as "row") sliced over expert tensor
parallelism, held by the expert-parallel rank its expert belongs to (experts split
contiguously over EP; `ExpertPlace`). Under sequence parallelism a
replicated parameter sees only the rank's sequence rows, so its gradient is a partial sum
that must be all-reduced over TP (Megatron's layernorm grads). QK-norm's gains (Qwen3) are
replicated too but applied to every head: a TP rank holds its own heads, so its gradient
is a partial sum over them and is all-reduced over TP whenever tp > 1, with or without SP
(`heads_shared`; HF transformers plans them "replicated_with_grad_allreduce",
configuration_qwen3_moe.py @008e5743 `base_model_tp_plan`).
"""
from __future__ import annotations

import math
from typing import Any, Iterator, NamedTuple, Sequence

import numpy as np

from .config import ModelConfig


class ExpertPlace(NamedTuple):
    """Which routed experts a rank holds and which slice of each: EP splits the experts
    contiguously, expert TP each expert's FFN (Megatron-Core's MoE parallel folding)."""

    ep: int = 1
    ep_rank: int = 0
    etp: int = 1
    etp_rank: int = 0


def expert_place(ex: Any) -> ExpertPlace:
    """An executor's place among the experts, from its EP and expert-TP groups (None: 1)."""
    ep, etp = getattr(ex, "ep", None), getattr(ex, "etp", None)
    return ExpertPlace(1 if ep is None else ep.size, 0 if ep is None else ep.rank,
                       1 if etp is None else etp.size, 0 if etp is None else etp.rank)


class LocalParam(NamedTuple):
    """One parameter tensor of a TP rank and where it comes from."""

    name: str
    full: tuple[str, ...]      # reference parameter names it is cut from
    kind: str
    shape: tuple[int, ...]     # local shape
    layer: int                 # -1 for embedding / final norm
    split: tuple[int, ...] = ()    # "qkv", "glu": local columns of each full tensor, in order
    heads_shared: bool = False     # a gain every head applies (QK-norm): partial over TP

    @property
    def tp_split(self) -> bool:
        return self.kind != "rep"

    @property
    def expert(self) -> bool:
        """A routed expert's: reduced over expert data parallelism, not DP."""
        return self.kind.startswith("expert")

    @property
    def sp_partial(self) -> bool:
        """Gradient is a partial sum over TP ranks under sequence parallelism."""
        return self.kind == "rep"

    def tp_partial(self, sp: bool, tp: int) -> bool:
        """Gradient is a partial sum over the tp ranks: a replicated parameter under SP
        (the rank's sequence rows), or a gain shared by heads split over TP."""
        return tp > 1 and ((sp and self.sp_partial) or self.heads_shared)

    @property
    def decay(self) -> bool:
        """Weight decay on matrices only (as the reference: not biases, not LayerNorm)."""
        return len(self.shape) == 2

    @property
    def size(self) -> int:
        return math.prod(self.shape)


def qkv_replicated(cfg: ModelConfig, tp: int) -> bool:
    """Whether TP exceeds the KV heads (each KV head then serves several ranks)."""
    return cfg.groups < tp


def local_params(cfg: ModelConfig, tp: int, place: ExpertPlace = ExpertPlace()
                 ) -> Iterator[LocalParam]:
    """Every parameter a (TP rank, expert place) holds, in forward order."""
    h, vl = cfg.hidden, cfg.padded_vocab // tp
    fl = cfg.ffn_hidden // tp
    yield LocalParam("wte", ("wte",), "vocab", (vl, h), -1)
    if cfg.position == "learned":
        yield LocalParam("wpe", ("wpe",), "rep", (cfg.seq_len, h), -1)
    if cfg.norm == "post":
        yield from _norm(cfg, "lne", -1)
    for i in range(cfg.layers):
        p = f"layers.{i}."
        yield from _norm(cfg, p + "ln1", i)
        yield from _latent(cfg, tp, p, i) if cfg.mla else _qkv(cfg, tp, p, i)
        if cfg.qk_norm:          # one RMSNorm gain of head_dim for q and one for k
            for x in ("q_norm.g", "k_norm.g"):
                yield LocalParam(p + x, (p + x,), "rep", (cfg.head_dim,), i, (), True)
        yield LocalParam(p + "proj.w", (p + "attn.wo",), "row", (cfg.attn_width // tp, h), i)
        if cfg.bias:
            yield LocalParam(p + "proj.b", (p + "attn.bo",), "rep", (h,), i)
        yield from _norm(cfg, p + "ln2", i)
        if cfg.moe is not None and cfg.moe.is_moe(i):
            yield from _experts(cfg, tp, place, i)
            continue
        kind, parts = ("glu", ("1", "3")) if cfg.gated else ("col", ("1",))
        split = (fl,) * len(parts) if cfg.gated else ()
        yield LocalParam(p + "fc1.w", tuple(p + f"mlp.w{x}" for x in parts), kind,
                         (h, fl * len(parts)), i, split)
        if cfg.bias:
            yield LocalParam(p + "fc1.b", tuple(p + f"mlp.b{x}" for x in parts), kind,
                             (fl * len(parts),), i, split)
        yield LocalParam(p + "fc2.w", (p + "mlp.w2",), "row", (fl, h), i)
        if cfg.bias:
            yield LocalParam(p + "fc2.b", (p + "mlp.b2",), "rep", (h,), i)
    if cfg.norm == "pre":
        yield from _norm(cfg, "lnf", -1)
    if not cfg.tied_embeddings:
        yield LocalParam("lm_head", ("lm_head",), "vocab", (vl, h), -1)


def _experts(cfg: ModelConfig, tp: int, place: ExpertPlace, i: int
             ) -> Iterator[LocalParam]:
    """An MoE layer's router (replicated), this EP rank's experts (their expert-TP slices),
    the shared experts (TP-sharded like a dense MLP)."""
    assert cfg.moe is not None
    h, n, p = cfg.hidden, cfg.moe.experts, f"layers.{i}."
    f = cfg.moe.expert_ffn // place.etp
    yield LocalParam(p + "router.w", (p + "moe.router",), "rep", (h, n), i)
    per = n // place.ep
    for e in range(place.ep_rank * per, (place.ep_rank + 1) * per):
        yield LocalParam(p + f"experts.{e}.fc1.w", (p + f"moe.{e}.w1", p + f"moe.{e}.w3"),
                         "expert_glu", (h, 2 * f), i, (f, f))
        yield LocalParam(p + f"experts.{e}.fc2.w", (p + f"moe.{e}.w2",), "expert_row", (f, h),
                         i)
    sf = cfg.moe.shared_ffn // tp
    if sf:
        yield LocalParam(p + "shared.fc1.w", (p + "shared.w1", p + "shared.w3"), "glu",
                         (h, 2 * sf), i, (sf, sf))
        yield LocalParam(p + "shared.fc2.w", (p + "shared.w2",), "row", (sf, h), i)


def _norm(cfg: ModelConfig, name: str, layer: int) -> Iterator[LocalParam]:
    for x in "gb" if cfg.norm_kind == "layernorm" else "g":
        yield LocalParam(f"{name}.{x}", (f"{name}.{x}",), "rep", (cfg.hidden,), layer)


def _latent(cfg: ModelConfig, tp: int, p: str, i: int) -> Iterator[LocalParam]:
    """MLA (Megatron-Core `MLASelfAttention`): the down projections and the latents' norms
    replicated (TELinear "duplicated"; under SP their gradients are partial sums over TP),
    the up projections column-parallel by heads (each head's columns contiguous)."""
    h, n, ql, kvl = cfg.hidden, cfg.heads // tp, cfg.q_lora_rank, cfg.kv_lora_rank
    q_cols = n * cfg.qk_head_dim
    if ql:
        yield LocalParam(p + "q_down.w", (p + "attn.wq_down",), "rep", (h, ql), i)
        yield LocalParam(p + "q_ln.g", (p + "attn.q_ln.g",), "rep", (ql,), i)
        yield LocalParam(p + "q_up.w", (p + "attn.wq_up",), "col", (ql, q_cols), i)
    else:
        yield LocalParam(p + "q.w", (p + "attn.wq",), "col", (h, q_cols), i)
    yield LocalParam(p + "kv_down.w", (p + "attn.wkv_down",), "rep",
                     (h, kvl + cfg.qk_rope_dim), i)
    yield LocalParam(p + "kv_ln.g", (p + "attn.kv_ln.g",), "rep", (kvl,), i)
    yield LocalParam(p + "kv_up.w", (p + "attn.wkv_up",), "col",
                     (kvl, n * (cfg.head_dim + cfg.v_dim)), i)


def _qkv(cfg: ModelConfig, tp: int, p: str, i: int) -> Iterator[LocalParam]:
    """The fused QKV weight (and bias) of a rank: its heads, or its grouped slice."""
    h, dh, nh, ng = cfg.hidden, cfg.head_dim, cfg.heads, cfg.groups
    names = ("w", "b") if cfg.bias else ("w",)
    for x in names:
        full = tuple(p + f"attn.{x}{t}" for t in "qkv")
        rows = (h,) if x == "w" else ()
        if qkv_replicated(cfg, tp):
            yield LocalParam(p + f"qkv.{x}", full, "qkv_grouped",
                             (*rows, (nh + 2 * ng) * dh // tp), i)
        else:
            split = (nh // tp * dh, ng // tp * dh, ng // tp * dh)
            yield LocalParam(p + f"qkv.{x}", full, "qkv", (*rows, sum(split)), i, split)


def grouped_qkv(cfg: ModelConfig, parts: Sequence[np.ndarray]) -> np.ndarray:
    """Wq | Wk | Wv (or their biases) in Megatron-Core's grouped column order: per KV group,
    its query heads, then its K head, then its V head."""
    dh, per = cfg.head_dim, cfg.heads // cfg.groups
    q, k, v = parts
    cols = []
    for g in range(cfg.groups):
        cols += [q[..., g * per * dh:(g + 1) * per * dh], k[..., g * dh:(g + 1) * dh],
                 v[..., g * dh:(g + 1) * dh]]
    return np.concatenate(cols, axis=-1)


def ungrouped_qkv(cfg: ModelConfig, grouped: np.ndarray) -> list[np.ndarray]:
    """Wq, Wk, Wv back from Megatron-Core's grouped order (`grouped_qkv`)."""
    dh, per = cfg.head_dim, cfg.heads // cfg.groups
    blocks = np.split(grouped, cfg.groups, axis=-1)
    return [np.concatenate([b[..., :per * dh] for b in blocks], axis=-1),
            np.concatenate([b[..., per * dh:(per + 1) * dh] for b in blocks], axis=-1),
            np.concatenate([b[..., (per + 1) * dh:] for b in blocks], axis=-1)]


def cut(lp: LocalParam, full: Sequence[np.ndarray], rank: int,
        cfg: ModelConfig | None = None) -> np.ndarray:
    """TP rank `rank`'s slice of the full tensor(s) a local parameter is cut from
    (`cfg`: the model, for the grouped QKV order)."""
    if lp.kind == "rep":
        return full[0].copy()
    if lp.split:                                          # "qkv", "glu": a slice of each
        return np.concatenate([f[..., rank * w:(rank + 1) * w]
                               for f, w in zip(full, lp.split)], axis=-1)
    if lp.kind == "qkv_grouped":
        assert cfg is not None, "the grouped QKV order needs the model"
        w = lp.shape[-1]
        return grouped_qkv(cfg, full)[..., rank * w:(rank + 1) * w].copy()
    if lp.kind == "col":
        w = lp.shape[-1]
        return full[0][..., rank * w:(rank + 1) * w].copy()
    rows = lp.shape[0]                                   # "row", "expert_row", "vocab"
    return full[0][rank * rows:(rank + 1) * rows].copy()


def shard_params(full: dict[str, np.ndarray], cfg: ModelConfig, tp: int, rank: int,
                 place: ExpertPlace = ExpertPlace()) -> dict[str, np.ndarray]:
    """The local tensors of TP rank `rank` (and expert place `place`), cut from the full
    (reference) parameters: an expert's by its expert-TP rank."""
    return {lp.name: cut(lp, [full[n] for n in lp.full],
                         place.etp_rank if lp.expert else rank, cfg)
            for lp in local_params(cfg, tp, place)}


def unshard_params(by_rank: Sequence[dict[str, np.ndarray]], cfg: ModelConfig
                   ) -> dict[str, np.ndarray]:
    """Full (reference-named) parameters from every TP rank's local tensors, in rank order
    (every expert on each rank: EP and expert TP 1)."""
    tp = len(by_rank)
    out: dict[str, np.ndarray] = {}
    for lp in local_params(cfg, tp):
        parts = [r[lp.name] for r in by_rank]
        if lp.kind == "rep":
            out[lp.full[0]] = parts[0].copy()
        elif lp.expert:
            out.update(zip(lp.full, np.split(parts[0], len(lp.full), axis=-1)))
        elif lp.split:
            edges = np.cumsum(lp.split)[:-1]
            pieces = [np.split(p, edges, axis=-1) for p in parts]
            for j, name in enumerate(lp.full):
                out[name] = np.concatenate([t[j] for t in pieces], axis=-1)
        elif lp.kind == "qkv_grouped":
            for name, t in zip(lp.full, ungrouped_qkv(cfg, np.concatenate(parts, axis=-1))):
                out[name] = t
        elif lp.kind == "col":
            out[lp.full[0]] = np.concatenate(parts, axis=-1)
        else:
            out[lp.full[0]] = np.concatenate(parts, axis=0)
    return out

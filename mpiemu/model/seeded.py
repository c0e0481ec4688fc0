"""Everything random, keyed so that any shard can regenerate exactly its part.

Initial weights are drawn per full tensor, data per sample, dropout masks per (sample) or
(sample, head) of the FULL, whole-global-batch tensor, each from its own key
(seed, purpose, iteration, layer, site, sample, head). A rank slices what it owns (its heads,
its sequence rows, its DP micro-batch); the one-process reference draws the same full masks.
"""
from __future__ import annotations

import zlib
from typing import Iterator

import numpy as np

from .config import ModelConfig

INIT, DATA, DROPOUT = 1, 2, 3
SITES = {"embed": 0, "attn_probs": 1, "attn_out": 2, "mlp_out": 3}
NOISE_FRACTION = 0.1   # share of data tokens drawn at random instead of by the recurrence


def generator(*key: int) -> np.random.Generator:
    """An independent stream for a tuple of non-negative integers."""
    return np.random.default_rng(np.random.SeedSequence([int(k) for k in key]))


def full_param_specs(cfg: ModelConfig) -> Iterator[tuple[str, tuple[int, ...], str]]:
    """(name, shape, init) of every parameter of the unsharded model, in forward order.

    init: "normal" N(0, std), "scaled" N(0, std / sqrt(2 layers)) for the projections that
    feed the residual stream (GPT-2, Megatron), "zeros" (biases), "ones" (norm gains).
    RMSNorm has no bias; a gated MLP has a gate `w1` and an up projection `w3` (Llama's
    names); rotary positions have no table; an untied model has its own `lm_head`. The
    query and output projections are heads x head_dim wide (`kv_channels`); QK-norm adds a
    gain of head_dim for q and one for k (`q_norm.g`, `k_norm.g`, ones as RMSNorm's).
    """
    h, f, kv, q = cfg.hidden, cfg.ffn_hidden, cfg.groups * cfg.head_dim, cfg.attn_width
    yield "wte", (cfg.padded_vocab, h), "normal"
    if cfg.position == "learned":
        yield "wpe", (cfg.seq_len, h), "normal"
    if cfg.norm == "post":
        yield from _norm(cfg, "lne")
    for i in range(cfg.layers):
        p = f"layers.{i}."
        yield from _norm(cfg, p + "ln1")
        if cfg.mla:
            yield from _latent(cfg, p)
        for x, width in () if cfg.mla else (("q", q), ("k", kv), ("v", kv)):
            yield p + f"attn.w{x}", (h, width), "normal"
            yield from _bias(cfg, p + f"attn.b{x}", width)
        if cfg.qk_norm:
            yield p + "q_norm.g", (cfg.head_dim,), "ones"
            yield p + "k_norm.g", (cfg.head_dim,), "ones"
        yield p + "attn.wo", (q, h), "scaled"
        yield from _bias(cfg, p + "attn.bo", h)
        yield from _norm(cfg, p + "ln2")
        if cfg.moe is not None and cfg.moe.is_moe(i):
            yield from _experts(cfg, p)
            continue
        for x in ("1", "3") if cfg.gated else ("1",):
            yield p + f"mlp.w{x}", (h, f), "normal"
            yield from _bias(cfg, p + f"mlp.b{x}", f)
        yield p + "mlp.w2", (f, h), "scaled"
        yield from _bias(cfg, p + "mlp.b2", h)
    if cfg.norm == "pre":
        yield from _norm(cfg, "lnf")
    if not cfg.tied_embeddings:
        yield "lm_head", (cfg.padded_vocab, h), "normal"


def _latent(cfg: ModelConfig, p: str) -> Iterator[tuple[str, tuple[int, ...], str]]:
    """MLA's weights before the output projection: the query's down projection [H, q_lora],
    its latent's norm gain and up projection [q_lora, heads x (dh + rope)] (or one [H, heads
    x (dh + rope)] without a query latent); the keys' and values' down projection [H,
    kv_lora + rope] (the latent, then the shared rotated key), its norm gain and up
    projection [kv_lora, heads x (dh + dv)], per head its key part then its value."""
    h, n, ql, kvl = cfg.hidden, cfg.heads, cfg.q_lora_rank, cfg.kv_lora_rank
    if ql:
        yield p + "attn.wq_down", (h, ql), "normal"
        yield p + "attn.q_ln.g", (ql,), "ones"
        yield p + "attn.wq_up", (ql, n * cfg.qk_head_dim), "normal"
    else:
        yield p + "attn.wq", (h, n * cfg.qk_head_dim), "normal"
    yield p + "attn.wkv_down", (h, kvl + cfg.qk_rope_dim), "normal"
    yield p + "attn.kv_ln.g", (kvl,), "ones"
    yield p + "attn.wkv_up", (kvl, n * (cfg.head_dim + cfg.v_dim)), "normal"


def _experts(cfg: ModelConfig, p: str) -> Iterator[tuple[str, tuple[int, ...], str]]:
    """An MoE layer's router [H, E], each expert's SwiGLU w1, w3 [H, F] and w2 [F, H], and
    the shared experts' (`moe.*`, `shared.*`)."""
    assert cfg.moe is not None
    h, m = cfg.hidden, cfg.moe
    yield p + "moe.router", (h, m.experts), "normal"
    for name, f in [(f"moe.{e}.", m.expert_ffn) for e in range(m.experts)] + \
            ([("shared.", m.shared_ffn)] if m.shared_ffn else []):
        yield p + name + "w1", (h, f), "normal"
        yield p + name + "w3", (h, f), "normal"
        yield p + name + "w2", (f, h), "scaled"


def _norm(cfg: ModelConfig, name: str) -> Iterator[tuple[str, tuple[int, ...], str]]:
    """A norm's gain, and its bias for LayerNorm (RMSNorm has none)."""
    yield name + ".g", (cfg.hidden,), "ones"
    if cfg.norm_kind == "layernorm":
        yield name + ".b", (cfg.hidden,), "zeros"


def _bias(cfg: ModelConfig, name: str, width: int) -> Iterator[tuple[str, tuple[int, ...], str]]:
    if cfg.bias:
        yield name, (width,), "zeros"


def init_tensor(cfg: ModelConfig, seed: int, name: str, shape: tuple[int, ...], init: str,
                dtype: type) -> np.ndarray:
    """One full parameter tensor, drawn from its own key (independent of all others)."""
    if init == "zeros":
        return np.zeros(shape, dtype)
    if init == "ones":
        return np.ones(shape, dtype)
    std = cfg.init_std / (np.sqrt(2.0 * cfg.layers) if init == "scaled" else 1.0)
    g = generator(seed, INIT, zlib.crc32(name.encode()))
    return (g.standard_normal(shape) * std).astype(dtype)


def init_full_params(cfg: ModelConfig, seed: int, dtype: type = np.float64
                     ) -> dict[str, np.ndarray]:
    """All parameters of the unsharded model, by name."""
    return {n: init_tensor(cfg, seed, n, s, i, dtype) for n, s, i in full_param_specs(cfg)}


def first_sample(dp_rank: int, micro: int, micro_batches: int, batch: int) -> int:
    """The global index of the first sample of DP rank `dp_rank`'s micro-batch `micro`
    (each DP rank takes `micro_batches` consecutive micro-batches of `batch` samples)."""
    return (dp_rank * micro_batches + micro) * batch


def batch(cfg: ModelConfig, seed: int, iteration: int, global_batch: int, lo: int = 0,
          hi: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic tokens and next-token targets of samples [lo, hi), each [n, S] int64.

    ASSUMPTION: a learnable stream (t' = 5 t + 3 mod vocab, 10% random tokens) stands in for
    a corpus, so the loss visibly falls in a few iterations.
    """
    hi = global_batch if hi is None else hi
    seqs = np.empty((hi - lo, cfg.seq_len + 1), np.int64)
    for row, b in enumerate(range(lo, hi)):
        g = generator(seed, DATA, iteration, b)
        noise = g.random(cfg.seq_len + 1) < NOISE_FRACTION
        rand = g.integers(0, cfg.vocab, cfg.seq_len + 1)
        t = int(rand[0])
        for j in range(cfg.seq_len + 1):
            t = int(rand[j]) if (j == 0 or noise[j]) else (5 * t + 3) % cfg.vocab
            seqs[row, j] = t
    return seqs[:, :-1], seqs[:, 1:]


def hidden_keep(seed: int, iteration: int, layer: int, site: str, sample: int,
                shape: tuple[int, int], p: float) -> np.ndarray:
    """Keep-mask [S, H] of one sample of a hidden-state dropout site."""
    g = generator(seed, DROPOUT, iteration, layer + 1, SITES[site], sample)
    return g.random(shape, dtype=np.float32) >= p


def probs_keep(seed: int, iteration: int, layer: int, sample: int, head: int, seq: int,
               p: float) -> np.ndarray:
    """Keep-mask [S, S] of one (sample, head) of the attention-probability dropout."""
    g = generator(seed, DROPOUT, iteration, layer + 1, SITES["attn_probs"], sample, head)
    return g.random((seq, seq), dtype=np.float32) >= p

"""A rank's shard of the transformer: parameters, and forward + backward of one iteration.

Vocab-parallel embedding tied with the LM head and a vocab-parallel cross-entropy (Megatron
VocabParallelEmbedding / _VocabParallelCrossEntropy), the layers of `layers.py`, gradients
handed to the DP buckets as they become final, and under sequence parallelism the TP
all-reduce of the gradients of parameters that only saw the rank's sequence rows.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..comm.p2p import TimedComm
from . import seeded
from .buckets import GradBuckets
from .config import ModelConfig
from .engine import Array, Dims, Engine
from .layers import Cache, Layer, Params, _t
from .masks import Masks
from .ops import (MASK_BYTES, Cost, bias_grad_cost, ce_back, ce_combine, ce_cost,
                  ce_local_stats, dropout, embed_cost, embed_lookup, embed_scatter, layernorm,
                  layernorm_back, layernorm_cost)
from .shard import LocalParam, cut, local_params


def make_dims(cfg: ModelConfig, tp: int, dp: int, global_batch: int, sp: bool) -> Dims:
    """Local sizes of every rank of a tp x dp grid (cfg already padded for tp)."""
    return Dims(seq=cfg.seq_len, batch=global_batch // dp, hidden=cfg.hidden,
                heads=cfg.heads // tp, head_dim=cfg.head_dim, ffn=cfg.ffn_hidden // tp,
                vocab=cfg.padded_vocab // tp, tp=tp, sp=sp and tp > 1)


class ShardedModel:
    """Parameters, gradients and the training-step schedule of one (tp_rank, dp_rank)."""

    def __init__(self, cfg: ModelConfig, eng: Engine, dims: Dims, *, tp_rank: int,
                 dp_rank: int, seed: int, global_batch: int, dp: TimedComm,
                 bucket_bytes: float, np_dtype: type) -> None:
        self.cfg, self.E, self.d = cfg, eng, dims
        self.tp_rank, self.dp_rank, self.seed = tp_rank, dp_rank, seed
        self.global_batch = global_batch
        self.specs: list[LocalParam] = list(local_params(cfg, dims.tp))
        self.P: Params = {lp.name: self._init(lp, np_dtype) for lp in self.specs}
        self.G: Params = {lp.name: None for lp in self.specs}
        self.layers = [Layer(eng, cfg, dims, i) for i in range(cfg.layers)]
        self.buckets = GradBuckets(dp, eng.e, bucket_bytes, {lp.name: lp.size for lp in self.specs},
                                   eng.overlap.bidirectional)
        s_loc = dims.seq // dims.tp if dims.sp else dims.seq
        self.s0 = tp_rank * s_loc if dims.sp else 0
        self.positions = np.repeat(np.arange(self.s0, self.s0 + s_loc), dims.batch)
        self.vocab_lo = tp_rank * dims.vocab
        self.keep_caches = False            # tests inspect the activations a step stored
        self.last_caches: tuple[Cache, list[Cache], Cache] | None = None

    def _init(self, lp: LocalParam, np_dtype: type) -> Array:
        if not self.E.on:
            return None
        full = [seeded.init_tensor(self.cfg, self.seed, n, s, i, np_dtype)
                for n, s, i in seeded.full_param_specs(self.cfg) if n in lp.full]
        return cut(lp, full, self.tp_rank)

    def _ready(self, names: list[str]) -> None:
        self.buckets.ready(names, self.G, self.E.t)

    # -- one iteration ----------------------------------------------------------------------
    def train_step(self, iteration: int) -> float:
        """Forward and backward of this rank's micro-batch; returns its share of the loss.

        The loss is the mean over the global batch's tokens, so DP ranks' shares add up.
        """
        d, E, tl = self.d, self.E, self.E.tl
        masks = Masks(self.cfg, self.seed, iteration, d, self.dp_rank, self.tp_rank, E.on)
        ids = targets = None
        if E.on:
            tok, tgt = seeded.batch(self.cfg, self.seed, iteration, self.global_batch,
                                    self.dp_rank * d.batch, (self.dp_rank + 1) * d.batch)
            ids, targets = tok.T.reshape(-1), tgt.T.reshape(-1)        # (S*B,) position-major
        self.buckets.reset()
        with tl.labelled(phase="fwd"):
            with tl.labelled(layer=-1):
                x, c_emb = self._embed(ids, masks)
            caches: list[Cache] = []
            for layer in self.layers:
                with tl.labelled(layer=layer.i):
                    x, c = layer.forward(x, self.P, masks)
                caches.append(c)
            with tl.labelled(layer=-1):
                loss, c_head = self._head(x, targets)
        with tl.labelled(phase="bwd"):
            with tl.labelled(layer=-1):
                dx = self._head_back(c_head, targets)
            for layer, c in zip(reversed(self.layers), reversed(caches)):
                with tl.labelled(layer=layer.i):
                    dx = layer.backward(dx, c, self.P, self.G, masks, self._ready)
            with tl.labelled(layer=-1):
                self._embed_back(dx, c_emb, ids)
                E.t = self.buckets.finish(self.G, E.t)    # the optimizer needs every bucket
                self._sp_grad_sync()
        if self.keep_caches:
            self.last_caches = (c_emb, caches, c_head)
        return loss

    # -- embedding --------------------------------------------------------------------------
    def _embed(self, ids: Array, masks: Masks) -> tuple[Array, Cache]:
        d, E, cfg = self.d, self.E, self.cfg
        rows, h = d.shard_rows, d.hidden
        part = E.kernel("embed.lookup", embed_cost(d.rows, h, E.e), embed_lookup, self.P["wte"],
                        ids, self.vocab_lo)
        x = E.tp_reduce("embed", part, d.rows, h)          # all-reduce, or RS to sequence rows
        x = E.kernel("embed.pos_add", Cost(rows * h, 2 * rows * h * E.e, rows * h * E.e),
                     self._add_positions, x)
        c: Cache = {}
        if cfg.norm == "post":
            res = E.kernel("lne.fwd", layernorm_cost(rows, h, E.e), layernorm, x,
                           self.P["lne.g"], self.P["lne.b"], cfg.layernorm_eps)
            x, c["lne"] = res if res is not None else (None, None)
        p = cfg.hidden_dropout
        if p > 0:
            keep = masks.hidden(-1, "embed")
            if keep is not None:
                c["keep"] = keep
            x = E.kernel("embed.dropout", Cost(rows * h, rows * h * E.e,
                                               rows * h * (E.e + MASK_BYTES)), dropout, x, keep, p)
        return x, c

    def _add_positions(self, x: np.ndarray) -> np.ndarray:
        wpe = self.P["wpe"]
        assert wpe is not None
        return x + wpe[self.positions]

    def _embed_back(self, dx: Array, c: Cache, ids: Array) -> None:
        d, E, cfg = self.d, self.E, self.cfg
        rows, h = d.shard_rows, d.hidden
        p = cfg.hidden_dropout
        if p > 0:
            dx = E.kernel("embed.dropout.bwd", Cost(rows * h, rows * h * (E.e + MASK_BYTES),
                                                    rows * h * E.e), dropout, dx, c.get("keep"), p)
        if cfg.norm == "post":
            res = E.kernel("lne.bwd", layernorm_cost(rows, h, E.e, backward=True),
                           layernorm_back, dx, c["lne"], self.P["lne.g"])
            dx, self.G["lne.g"], self.G["lne.b"] = res if res is not None else (None,) * 3
            self._ready(["lne.g", "lne.b"])
        self.G["wpe"] = E.kernel("embed.pos.bwd", bias_grad_cost(rows, h, E.e),
                                 self._position_grad, dx)
        self._ready(["wpe"])
        full = E.tp_gather_rows("embed.bwd", dx, d.rows, h) if d.sp else dx
        E.kernel("embed.scatter.bwd", embed_cost(d.rows, h, E.e, backward=True),
                 embed_scatter, self.G["wte"], ids, self.vocab_lo, full)
        self._ready(["wte"])

    def _position_grad(self, dx: np.ndarray) -> np.ndarray:
        d = self.d
        g = np.zeros((d.seq, d.hidden), dx.dtype)
        rows = dx.reshape(-1, d.batch, d.hidden).sum(1)                # (S_loc, H)
        g[self.s0:self.s0 + rows.shape[0]] = rows
        return g

    # -- LM head and cross-entropy ----------------------------------------------------------
    def _head(self, x: Array, targets: Array) -> tuple[float, Cache]:
        d, E, cfg = self.d, self.E, self.cfg
        c: Cache = {}
        if cfg.norm == "pre":
            res = E.kernel("lnf.fwd", layernorm_cost(d.shard_rows, d.hidden, E.e), layernorm, x,
                           self.P["lnf.g"], self.P["lnf.b"], cfg.layernorm_eps)
            x, c["lnf"] = res if res is not None else (None, None)
        logits, c["x"] = E.column_parallel("head.fwd", x, _t(self.P["wte"]), d.rows, d.vocab,
                                           d.hidden)
        c["logits"] = logits
        stats = E.kernel("head.ce.fwd", ce_cost(d.rows, d.vocab, E.e), ce_local_stats,
                         logits, targets, self.vocab_lo)
        flat = None if stats is None else stats.reshape(1, -1)       # (1, 2 S*B) per rank
        every = E.tp_gather_rows("head.ce", flat, d.tp, 2 * d.rows, itemsize=4)
        if every is None:
            return 0.0, c
        lse, picked = ce_combine(every.reshape(d.tp, d.rows, 2))
        c["lse"] = lse
        n_tokens = self.global_batch * d.seq
        return float((lse - picked).sum() / n_tokens), c

    def _head_back(self, c: Cache, targets: Array) -> Array:
        d, E = self.d, self.E
        scale = 1.0 / (self.global_batch * d.seq)
        dlogits = E.kernel("head.ce.bwd", ce_cost(d.rows, d.vocab, E.e, backward=True), ce_back,
                           c["logits"], c.get("lse"), targets, self.vocab_lo, scale)
        self.G["wte"] = E.gemm("head.wgrad", _t(dlogits), c["x"], d.vocab, d.hidden, d.rows)
        dx = E.row_parallel("head.bwd", dlogits, self.P["wte"], d.rows, d.hidden, d.vocab)
        if self.cfg.norm == "pre":
            res = E.kernel("lnf.bwd", layernorm_cost(d.shard_rows, d.hidden, E.e, backward=True),
                           layernorm_back, dx, c["lnf"], self.P["lnf.g"])
            dx, self.G["lnf.g"], self.G["lnf.b"] = res if res is not None else (None,) * 3
            self._ready(["lnf.g", "lnf.b"])
        return dx

    # -- sequence parallelism: replicated parameters saw only this rank's rows ---------------
    def _sp_grad_sync(self) -> None:
        """All-reduce over TP the gradients of replicated parameters (Megatron SP)."""
        if not self.d.sp:
            return
        names = [lp.name for lp in self.specs if lp.sp_partial]
        count = sum(lp.size for lp in self.specs if lp.sp_partial)
        flat = None
        if self.E.on:
            flat = np.concatenate([np.ravel(self.G[n]) for n in names])   # type: ignore[arg-type]
        out = self.E.tp_sum("tp.sp_grads", flat, count, self.E.e)
        if out is not None:
            offset = 0
            for n in names:
                g: Any = self.G[n]
                self.G[n] = out[offset:offset + g.size].reshape(g.shape)
                offset += g.size

"""Multi-head latent attention on one TP rank (DeepSeek-V2 / V3, arXiv 2412.19437 2.1.1;
Megatron-Core `multi_latent_attention.py` `MLASelfAttention`).

The query comes from a low-rank latent (`q_lora_rank`; without one, straight from the
hidden state), the keys and values from one shared latent (`kv_lora_rank`), each latent
RMSNormed. The down projections and the latents' norms are replicated over TP and run on
the rank's rows (its sequence shard under SP: Megatron-Core's "duplicated" TELinear, whose
weight gradients are then partial sums over TP); the up projections are column-parallel by
heads (under SP the latent, not the hidden state, is all-gathered first). A query or key
head is `head_dim` values plus `qk_rope_dim` rotated ones (decoupled RoPE); the keys'
rotated part comes with the KV latent, one for all heads, so it is all-gathered over SP
and its gradient, summed over the heads, reduced over TP. A value head is `v_head_dim`
wide; the output projection is row-parallel. RoPE rotates halves (Megatron-Core turns the
interleaved pairs of DeepSeek's checkpoints into halves, `apply_rotary_pos_emb(mla=True)`:
a fixed permutation of the weights' columns). Activations are [S*B, width], sequence first.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from . import attention as attn
from .block import Block, Cache, Params, acc, transposed
from .executor import Array, Ready
from .masks import Masks
from .ops import Cost, norm_cost, rmsnorm, rmsnorm_back, rope, rope_back, rope_cost
from .self_attention import core_shape


class LatentAttention(Block):
    """Forward and backward of layer `index`'s MLA on one rank."""

    # -- forward ------------------------------------------------------------------------------
    def forward(self, y: Array, P: Params, masks: Masks) -> tuple[Array, Cache]:
        d, E, cfg, p, tag = self.d, self.E, self.cfg, self.p, self.tag
        n, dn, dr, dv = d.heads, cfg.head_dim, cfg.qk_rope_dim, cfg.v_dim
        kvl = cfg.kv_lora_rank
        c: Cache = {"h": y}
        q = self._query(y, P, c)                                     # [rows, n (dn + dr)]
        ckv = E.gemm(f"{tag}.kv_down.fwd", y, P[p + "kv_down.w"], d.shard_rows, kvl + dr,
                     d.hidden)                                       # [ts, kvl + dr]
        lat, kpe = (None, None) if ckv is None else (ckv[:, :kvl], ckv[:, kvl:])
        c["lat"], c["kv_ln"] = self._norm("kv_ln", lat, P, kvl)
        kv, _ = E.column_parallel(f"{tag}.kv_up.fwd", c["lat"], P[p + "kv_up.w"], d.rows,
                                  n * (dn + dv), kvl)                # [rows, n (dn + dv)]
        if d.sp:                  # the shared rotated key of every row of the sequence
            kpe = E.tp_gather_rows(f"{tag}.k_pe.gather", kpe, d.rows, dr)
        qkv = E.kernel(f"{tag}.rope.fwd", self._rope_cost(), self._heads, q, kv, kpe)
        if E.on:
            q, k, v = (np.asarray(E.round(t)) for t in qkv)          # rotated: stored
            o, a = attn.forward(cfg.attention, q, k, v, cfg.causal,
                                lambda: masks.probs(self.i), cfg.attention_dropout,
                                cfg.attention_block)
            c["ctx"] = E.round(self._merge(o))                        # [rows, n dv]
            c["attn"] = {key: a[key] for key in ("q", "k", "v")} if self.selective else a
        self._charge_core(backward=False)
        out = E.row_parallel(f"{tag}.proj.fwd", c.get("ctx"), P[p + "proj.w"], d.rows,
                             d.hidden, n * dv)
        return out, c

    def _query(self, y: Array, P: Params, c: Cache) -> Array:
        """[rows, n (dn + dr)]: the rank's query heads, through the query latent if any."""
        d, E, cfg, p, tag = self.d, self.E, self.cfg, self.p, self.tag
        width, ql = d.heads * cfg.qk_head_dim, cfg.q_lora_rank
        if not ql:
            return E.column_parallel(f"{tag}.q.fwd", y, P[p + "q.w"], d.rows, width,
                                     d.hidden)[0]
        cq = E.gemm(f"{tag}.q_down.fwd", y, P[p + "q_down.w"], d.shard_rows, ql, d.hidden)
        c["cq"], c["q_ln"] = self._norm("q_ln", cq, P, ql)
        return E.column_parallel(f"{tag}.q_up.fwd", c["cq"], P[p + "q_up.w"], d.rows, width,
                                 ql)[0]

    def _norm(self, name: str, x: Array, P: Params, width: int) -> tuple[Array, Any]:
        """A latent's RMSNorm over its `width` values, on the rank's rows."""
        E = self.E
        res = E.kernel(f"{self.tag}.{name}.fwd", norm_cost("rmsnorm", self.d.shard_rows,
                                                           width, E.e),
                       rmsnorm, x, P[self.p + name + ".g"], self.cfg.layernorm_eps)
        return (E.round(res[0]), res[1]) if res is not None else (None, None)

    # -- backward -----------------------------------------------------------------------------
    def backward(self, da: Array, c: Cache, P: Params, G: Params, masks: Masks,
                 with_bias: list[str], ready: Ready) -> Array:
        d, E, cfg, p, tag = self.d, self.E, self.cfg, self.p, self.tag
        n, dn, dr, dv, kvl = d.heads, cfg.head_dim, cfg.qk_rope_dim, cfg.v_dim, cfg.kv_lora_rank
        dctx, da_full = E.column_parallel(f"{tag}.proj.bwd", da, transposed(P[p + "proj.w"]),
                                          d.rows, n * dv, d.hidden)
        acc(G, p + "proj.w", E.wgrad(f"{tag}.proj.wgrad", transposed(c.get("ctx")), da_full,
                                     n * dv, d.hidden, d.rows))
        ready([p + "proj.w"])
        grads = self._core_back(dctx, c, masks) if E.on else None
        if self.selective:
            with E.labelled(phase="recompute"):
                self._charge_core(backward=False, suffix=".recompute")
        self._charge_core(backward=True)
        parts = E.kernel(f"{tag}.rope.bwd", self._rope_cost(), self._heads_back, grads)
        dq, dkv, dkpe = (None, None, None) if parts is None else parts
        dlat, dw = E.column_parallel_back(f"{tag}.kv_up", dkv, transposed(P[p + "kv_up.w"]),
                                          c["lat"], d.rows, kvl, n * (dn + dv))
        acc(G, p + "kv_up.w", dw)
        ready([p + "kv_up.w"])
        dlat = self._norm_back("kv_ln", dlat, c["kv_ln"], P, G, kvl, ready)
        # every head's share of the shared rotated key, summed over TP (RS under SP)
        dkpe = E.tp_reduce(f"{tag}.k_pe.bwd", dkpe, d.rows, dr)
        dckv = None if dlat is None else np.concatenate([dlat, dkpe], axis=1)
        dx = self._down_back("kv_down", dckv, c["h"], P, G, kvl + dr, ready)
        dxq = self._query_back(dq, c, P, G, ready)
        return E.kernel(f"{tag}.latent.residual.bwd",
                        Cost(d.shard_rows * d.hidden, 2 * d.shard_rows * d.hidden * E.e,
                             d.shard_rows * d.hidden * E.e), np.add, dx, dxq)

    def _query_back(self, dq: Array, c: Cache, P: Params, G: Params, ready: Ready) -> Array:
        """The query path's input gradient [ts, H]; its weights' gradients into G."""
        d, E, cfg, p, tag = self.d, self.E, self.cfg, self.p, self.tag
        width, ql = d.heads * cfg.qk_head_dim, cfg.q_lora_rank
        if not ql:
            dx, dw = E.column_parallel_back(f"{tag}.q", dq, transposed(P[p + "q.w"]), c["h"],
                                            d.rows, d.hidden, width)
            acc(G, p + "q.w", dw)
            ready([p + "q.w"])
            return dx
        dcq, dw = E.column_parallel_back(f"{tag}.q_up", dq, transposed(P[p + "q_up.w"]),
                                         c["cq"], d.rows, ql, width)
        acc(G, p + "q_up.w", dw)
        ready([p + "q_up.w"])
        dcq = self._norm_back("q_ln", dcq, c["q_ln"], P, G, ql, ready)
        return self._down_back("q_down", dcq, c["h"], P, G, ql, ready)

    def _norm_back(self, name: str, dy: Array, nc: Any, P: Params, G: Params, width: int,
                   ready: Ready) -> Array:
        E, g = self.E, self.p + name + ".g"
        res = E.kernel(f"{self.tag}.{name}.bwd",
                       norm_cost("rmsnorm", self.d.shard_rows, width, E.e, backward=True),
                       rmsnorm_back, dy, nc, P[g])
        if res is not None:
            acc(G, g, res[1])
        ready([g])
        return None if res is None else E.round(res[0])

    def _down_back(self, name: str, dy: Array, x: Array, P: Params, G: Params, width: int,
                   ready: Ready) -> Array:
        """A replicated down projection's input gradient [ts, H] and weight gradient (a
        partial sum over TP under SP: the rank's rows only)."""
        d, E, w = self.d, self.E, self.p + f"{name}.w"
        acc(G, w, E.wgrad(f"{self.tag}.{name}.wgrad", transposed(x), dy, d.hidden, width,
                          d.shard_rows))
        ready([w])
        return E.gemm(f"{self.tag}.{name}.bwd", dy, transposed(P[w]), d.shard_rows, d.hidden,
                      width)

    def _core_back(self, dctx: Array, c: Cache, masks: Masks
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(dq, dk, dv) (B, n, S, width) of the attention core."""
        cfg = self.cfg
        assert dctx is not None
        do = np.ascontiguousarray(self._split_heads(dctx, cfg.v_dim))
        a = dict(c["attn"])
        keep = lambda: masks.probs(self.i)  # noqa: E731
        if self.selective:
            a = attn.forward(cfg.attention, a["q"], a["k"], a["v"], cfg.causal, keep,
                             cfg.attention_dropout, cfg.attention_block)[1]
        if cfg.attention != "flash":
            grads = attn.dense_back(do, a, cfg.attention_dropout)
        else:
            o = self._split_heads(c["ctx"], cfg.v_dim)
            grads = attn.flash_backward(do, o, a, cfg.causal, keep, cfg.attention_dropout,
                                        cfg.attention_block)
        return tuple(self.E.round(g) for g in grads)     # type: ignore[return-value]

    # -- heads --------------------------------------------------------------------------------
    def _heads(self, q: np.ndarray, kv: np.ndarray, kpe: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """q, k (B, n, S, dn + dr) and v (B, n, S, dv): the rotated parts rotated, the
        shared rotated key given to every head."""
        d, cfg = self.d, self.cfg
        dn, dr = cfg.head_dim, cfg.qk_rope_dim
        cos, sin = self._tables(q.dtype.type)
        q3 = q.reshape(d.rows, d.heads, dn + dr)
        q3 = np.concatenate([q3[..., :dn], rope(q3[..., dn:], cos, sin)], axis=-1)
        kv3 = kv.reshape(d.rows, d.heads, dn + cfg.v_dim)
        kr = np.broadcast_to(rope(kpe[:, None, :], cos, sin), (d.rows, d.heads, dr))
        k3 = np.concatenate([kv3[..., :dn], kr], axis=-1)
        return self._to_heads(q3), self._to_heads(k3), self._to_heads(kv3[..., dn:])

    def _heads_back(self, grads: tuple[np.ndarray, np.ndarray, np.ndarray] | None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Conjugate of `_heads`: (dq [rows, n (dn + dr)], d[k | v] [rows, n (dn + dv)],
        d rotated key [rows, dr] of this rank's heads)."""
        cfg = self.cfg
        dn = cfg.head_dim
        assert grads is not None
        dq, dk, dv = (self._from_heads(g) for g in grads)            # (rows, n, width)
        cos, sin = self._tables(dq.dtype.type)
        dq = np.concatenate([dq[..., :dn], rope_back(dq[..., dn:], cos, sin)], axis=-1)
        dkpe = rope_back(dk[..., dn:].sum(1, keepdims=True), cos, sin)[:, 0]
        dkv = np.concatenate([dk[..., :dn], dv], axis=-1)
        rows = self.d.rows
        return dq.reshape(rows, -1), dkv.reshape(rows, -1), dkpe

    def _to_heads(self, x: np.ndarray) -> np.ndarray:
        d = self.d
        return np.ascontiguousarray(x.reshape(d.seq, d.batch, d.heads, -1)
                                    .transpose(1, 2, 0, 3))          # (B, n, S, width)

    def _from_heads(self, x: np.ndarray) -> np.ndarray:
        return x.transpose(2, 0, 1, 3).reshape(self.d.rows, self.d.heads, -1)

    def _split_heads(self, x: np.ndarray, width: int) -> np.ndarray:
        d = self.d
        return x.reshape(d.seq, d.batch, d.heads, width).transpose(1, 2, 0, 3)

    def _merge(self, o: np.ndarray) -> np.ndarray:
        return o.transpose(2, 0, 1, 3).reshape(self.d.rows, -1)     # (S*B, n * width)

    def _tables(self, dtype: type) -> tuple[np.ndarray, np.ndarray]:
        """cos, sin [rows, 1, dr] of the rows' positions over the rotated dims."""
        cos, sin = self.rope_rows(self.cfg.qk_rope_dim, dtype)
        return cos[:, None], sin[:, None]

    # -- costs --------------------------------------------------------------------------------
    def _rope_cost(self) -> list[Cost]:
        """RoPE on the query heads' and the shared key's rotated parts, and the
        concatenations that make whole q and k heads (Megatron-Core
        `get_query_key_value_tensors`: `torch.cat`, the rotated key expanded to every
        head)."""
        d, cfg, E = self.d, self.cfg, self.E
        dr, e = cfg.qk_rope_dim, E.e
        width = d.rows * d.heads * cfg.qk_head_dim
        return rope_cost(d.rows, d.heads * dr, d.seq, dr, e, E.kernels.mode) + \
            rope_cost(d.rows, dr, d.seq, dr, e, E.kernels.mode) + \
            [Cost(0, width * e, width * e), Cost(0, width * e, width * e)]

    def _charge_core(self, backward: bool, suffix: str = "") -> None:
        name = f"{self.tag}.attn" + (".bwd" if backward else suffix)
        shape = core_shape(self.d, self.cfg, self.E.e, self.cfg.qk_head_dim, self.cfg.v_dim)
        self.E.attention(name, shape, self.cfg.attention, backward)

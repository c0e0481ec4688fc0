"""A layer's self-attention on one TP rank: column-parallel QKV, rotary positions, the
attention core over the rank's heads, row-parallel output projection (thesis 2.3.3, 4.5.1).

Heads are split contiguously over TP. With grouped-query attention (`model.kv_heads`) a
rank holds its query heads and the KV heads they use; when TP exceeds the KV heads, each
rank's QKV GEMM makes an even slice of the grouped QKV output (per KV group: its query
heads, K, V), which is all-gathered over TP and each rank keeps its group and its query
heads (Megatron-Core `get_query_key_value_tensors`); backward reduce-scatters the gradient.
Query head j attends with KV head j // (query heads per KV head). QK-norm (Qwen3;
Megatron-Core `qk_layernorm`) normalizes each q and k head over its head_dim values (RMSNorm,
one gain each shared by the heads) after the QKV GEMM, and rotary positions (Llama) then
rotate q and k; under context parallelism the K blocks travel normalized and rotated. A
head is `model.kv_channels` wide, so the attention's width heads x head_dim need not be
the hidden size. Activations are [S*B, width], sequence first.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..devices.attention_gpu import AttnShape
from ..devices.gemm import NO_EPILOGUE, Epilogue
from . import attention as attn
from .block import Block, Cache, Params, acc, transposed
from .config import ModelConfig
from .context_parallel import CpAttention, MaskFn
from .dims import Dims
from .executor import Array, Ready
from .masks import Masks
from .ops import Cost, bias_add_cost, bias_grad_cost, rope, rope_back, rope_cost
from .qk_norm import QkNorm

# Megatron-LM's fused softmax runs for half-precision scores of at most this many keys, else
# torch's softmax (megatron/model/fused_softmax.py at de593298, is_kernel_available)
FUSED_SOFTMAX_MAX_KEYS = 4096


def core_shape(d: Dims, cfg: ModelConfig, e: int, head_dim: int, v_dim: int = 0) -> AttnShape:
    """The attention core of a rank's heads (query / key heads `head_dim` wide, value heads
    `v_dim`: 0 as wide) as the device's kernels see it."""
    return AttnShape(d.batch * d.heads, d.seq, d.seq, head_dim, e,
                     dropout=cfg.attention_dropout > 0, causal=cfg.causal, training=True,
                     triangle=e < 4 and d.seq <= FUSED_SOFTMAX_MAX_KEYS, v_dim=v_dim)


class SelfAttention(Block):
    """Forward and backward of layer `index`'s self-attention on one rank."""

    # -- forward ------------------------------------------------------------------------------
    def forward(self, y: Array, P: Params, masks: Masks) -> tuple[Array, Cache]:
        d, E, cfg, p = self.d, self.E, self.cfg, self.p
        w = d.qkv_width
        epi = self._bias_epilogue(w)
        qkv, _ = E.column_parallel(f"{self.tag}.qkv.fwd", y, P[p + "qkv.w"], d.rows, w,
                                   d.hidden, epi)
        if cfg.bias:
            # Megatron-LM adds the QKV bias after the GEMM (megatron/mpu/layers.py at
            # de593298, LinearWithGradAccumulationAndAsyncCommunication.forward, 235-237)
            qkv = E.kernel(f"{self.tag}.qkv.bias", [] if epi != NO_EPILOGUE else
                           bias_add_cost(d.rows, w, E.e), np.add, qkv, P[p + "qkv.b"])
        if d.gathered:            # TP exceeds the KV heads: every rank's slice, all of it
            qkv = E.tp_gather_cols(f"{self.tag}.qkv.gather", qkv, d.rows, w)
        c: Cache = {"h": y}       # the input (its sequence shard under SP: gathered again)
        if qkv is not None and d.gathered:
            qkv = self._own_group(qkv)
        if cfg.qk_norm:
            c["qk_norm"] = self._qk_norm().forward(qkv, P)
        qkv = E.round(self._rope(qkv, backward=False))     # q, k normed and rotated: stored
        if d.cp > 1:              # the whole sequence's KV, from the other CP ranks
            q, k, v = self._split(qkv) if qkv is not None else (None, None, None)
            o, c["attn"] = self._cp().forward(q, k, v, self._cp_keep(masks))
            c["ctx"] = None if o is None else E.round(self._merge(o))
        elif E.on:
            assert qkv is not None
            q, k, v = self._split(qkv)
            o, a = attn.forward(cfg.attention, q, self._repeat(k), self._repeat(v), cfg.causal,
                                lambda: masks.probs(self.i), cfg.attention_dropout,
                                cfg.attention_block)
            a.update(k=k, v=v)    # kept once per KV head, repeated again in backward
            # one fused kernel: fp32 inside, its output a tensor of the numerics' format
            c["ctx"] = E.round(self._merge(o))
            c["attn"] = {key: a[key] for key in ("q", "k", "v")} if self.selective else a
        if d.cp == 1:
            self._charge_core(backward=False)
        out = E.row_parallel(f"{self.tag}.proj.fwd", c.get("ctx"), P[p + "proj.w"], d.rows,
                             d.hidden, d.attn_width)
        return out, c

    # -- backward -----------------------------------------------------------------------------
    def backward(self, da: Array, c: Cache, P: Params, G: Params, masks: Masks,
                 with_bias: list[str], ready: Ready) -> Array:
        d, E, p = self.d, self.E, self.p
        w = d.attn_width
        dctx, da_full = E.column_parallel(f"{self.tag}.proj.bwd", da,
                                          transposed(P[p + "proj.w"]), d.rows, w, d.hidden)
        acc(G, p + "proj.w", E.wgrad(f"{self.tag}.proj.wgrad", transposed(c.get("ctx")),
                                    da_full, w, d.hidden, d.rows))
        ready([p + "proj.w"] + with_bias)
        if d.cp > 1:
            dqkv = E.round(self._cp_back(dctx, c, masks))
        else:
            dqkv = E.round(self._core_back(dctx, c, masks)) if E.on else None
            if self.selective:
                with E.labelled(phase="recompute"):
                    self._charge_core(backward=False, suffix=".recompute")
            self._charge_core(backward=True)
        dqkv = self._rope(dqkv, backward=True)
        if self.cfg.qk_norm:
            self._qk_norm().backward(dqkv, c["qk_norm"], P, G, ready)
        dqkv = E.round(dqkv)
        if dqkv is not None and d.gathered:
            dqkv = self._grouped_grad(dqkv)
        if d.gathered:            # each rank's share of every rank's gradient, summed
            dqkv = E.tp_scatter_cols(f"{self.tag}.qkv.scatter", dqkv, d.rows, d.qkv_width)
        qkv_b = self.biases("qkv.b")
        if qkv_b:
            acc(G, qkv_b[0], E.kernel(f"{self.tag}.qkv.bias_grad",
                                      bias_grad_cost(d.rows, d.qkv_width, E.e), np.sum, dqkv,
                                      0))
        dx, dw = E.column_parallel_back(f"{self.tag}.qkv", dqkv, transposed(P[p + "qkv.w"]),
                                        c["h"], d.rows, d.hidden, d.qkv_width)
        acc(G, p + "qkv.w", dw)
        ready([p + "qkv.w"] + qkv_b)
        return dx

    def _core_back(self, dctx: Array, c: Cache, masks: Masks) -> np.ndarray:
        """The attention core's input gradients as the QKV output's ([rows, q | k | v])."""
        d, cfg = self.d, self.cfg
        assert dctx is not None
        do = np.ascontiguousarray(dctx.reshape(d.seq, d.batch, d.heads, d.head_dim)
                                  .transpose(1, 2, 0, 3))               # (B, hl, S, dh)
        a = dict(c["attn"])
        a["k"], a["v"] = self._repeat(a["k"]), self._repeat(a["v"])
        keep: Callable[[], np.ndarray | None] = lambda: masks.probs(self.i)  # noqa: E731
        if self.selective:        # the attention core again, from the kept q, k, v
            a = attn.forward(cfg.attention, a["q"], a["k"], a["v"], cfg.causal, keep,
                             cfg.attention_dropout, cfg.attention_block)[1]
        if cfg.attention != "flash":
            dq, dk, dv = attn.dense_back(do, a, cfg.attention_dropout)
        else:
            o = c["ctx"].reshape(d.seq, d.batch, d.heads, d.head_dim).transpose(1, 2, 0, 3)
            dq, dk, dv = attn.flash_backward(do, o, a, cfg.causal, keep,
                                             cfg.attention_dropout, cfg.attention_block)
        grads = [dq, self._fold(dk), self._fold(dv)]
        return np.concatenate([self._merge(g) for g in grads], axis=1)   # (S*B, q | k | v)

    # -- context parallelism (`context_parallel`) ------------------------------------------------
    def _cp(self) -> CpAttention:
        """The CP group's attention over this layer's heads (the ring, or gathered KV)."""
        d, cfg = self.d, self.cfg
        kv_bytes = 2 * d.rows * d.kv_heads * d.head_dim * self.E.e
        return CpAttention(self.E, f"{self.tag}.attn", cfg.seq_len, cfg.causal,
                           cfg.attention_dropout, self.cp_comm, self._attn_shape(), kv_bytes,
                           self._repeat, self._fold)

    def _cp_keep(self, masks: Masks) -> MaskFn:
        """The attention dropout's keep-mask of (query, key) positions."""
        return lambda pq, pk: masks.probs(self.i)[:, :, pq][:, :, :, pk]   # type: ignore[index]

    def _cp_back(self, dctx: Array, c: Cache, masks: Masks) -> Array:
        """The CP attention's input gradients as the QKV output's ([rows, q | k | v])."""
        d = self.d
        do = o = None
        if dctx is not None:
            do = np.ascontiguousarray(dctx.reshape(d.seq, d.batch, d.heads, d.head_dim)
                                      .transpose(1, 2, 0, 3))           # (B, hl, S, dh)
            o = c["ctx"].reshape(d.seq, d.batch, d.heads, d.head_dim).transpose(1, 2, 0, 3)
        dq, dk, dv = self._cp().backward(do, o, c["attn"], self._cp_keep(masks))
        if dq is None or dk is None or dv is None:
            return None
        return np.concatenate([self._merge(g) for g in (dq, dk, dv)], axis=1)  # (S*B, q|k|v)

    # -- heads: split, merged, shared by a group -----------------------------------------------
    def _split(self, qkv: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """q (B, hl, S, dh) and k, v (B, kv heads, S, dh) of the rank's QKV output."""
        d = self.d
        t = qkv.reshape(d.seq, d.batch, -1)                              # (S, B, width)
        qw, kw = d.heads * d.head_dim, d.kv_heads * d.head_dim

        def heads(x: np.ndarray, n: int) -> np.ndarray:
            return np.ascontiguousarray(x.reshape(d.seq, d.batch, n, d.head_dim)
                                        .transpose(1, 2, 0, 3))          # (B, n, S, dh)
        return (heads(t[..., :qw], d.heads), heads(t[..., qw:qw + kw], d.kv_heads),
                heads(t[..., qw + kw:qw + 2 * kw], d.kv_heads))

    def _merge(self, o: np.ndarray) -> np.ndarray:
        d = self.d
        return o.transpose(2, 0, 1, 3).reshape(d.rows, -1)            # (S*B, heads * dh)

    def _repeat(self, kv: np.ndarray) -> np.ndarray:
        """KV heads repeated for the query heads that share each (GQA); as is without."""
        r = self.d.heads // self.d.kv_heads
        return kv if r == 1 else np.repeat(kv, r, axis=1)

    def _fold(self, dkv: np.ndarray) -> np.ndarray:
        """The gradient of `_repeat`: the query heads' shares summed per KV head."""
        d = self.d
        r = d.heads // d.kv_heads
        if r == 1:
            return dkv
        b, _, s, dh = dkv.shape
        return dkv.reshape(b, d.kv_heads, r, s, dh).sum(2)

    # -- rotary positions and the grouped QKV ---------------------------------------------------
    def _qk_norm(self) -> QkNorm:
        """QK-norm over the rank's q and k heads (`qk_norm`)."""
        return QkNorm(self.E, self.cfg, self.d, self.p, self.tag)

    def _rope(self, qkv: Array, backward: bool) -> Array:
        """q and k of the rank's [rows, q | k | v] rotated by their positions (in place), or
        their gradients rotated back."""
        d, E, cfg = self.d, self.E, self.cfg
        if cfg.position != "rope":
            return qkv
        sfx = ".bwd" if backward else ".fwd"
        qw, kw = d.heads * d.head_dim, d.kv_heads * d.head_dim
        fn = self._rotate_back if backward else self._rotate
        for what, lo, width in (("q", 0, qw), ("k", qw, kw)):
            E.kernel(f"{self.tag}.rope.{what}{sfx}",
                     rope_cost(d.rows, width, d.seq, d.head_dim, E.e, E.kernels.mode),
                     fn, qkv, lo, width)
        return qkv

    def _rotate(self, qkv: np.ndarray, lo: int, width: int) -> None:
        """Rotate the heads of columns [lo, lo + width) in place."""
        cos, sin = self.rope_rows(self.d.head_dim, qkv.dtype.type)
        x = qkv[:, lo:lo + width].reshape(self.d.rows, -1, self.d.head_dim)  # (rows, h, dh)
        qkv[:, lo:lo + width] = rope(x, cos[:, None], sin[:, None]).reshape(self.d.rows, -1)

    def _rotate_back(self, dqkv: np.ndarray, lo: int, width: int) -> None:
        cos, sin = self.rope_rows(self.d.head_dim, dqkv.dtype.type)
        x = dqkv[:, lo:lo + width].reshape(self.d.rows, -1, self.d.head_dim)
        dqkv[:, lo:lo + width] = rope_back(x, cos[:, None], sin[:, None]).reshape(
            self.d.rows, -1)

    def _group_columns(self) -> tuple[slice, slice, slice]:
        """The rank's q, k and v columns in the gathered grouped QKV output."""
        d, cfg = self.d, self.cfg
        per = cfg.heads // cfg.groups                        # query heads per KV head
        ranks = d.tp // cfg.groups                          # ranks sharing a KV head
        r, dh = self.E.tp.rank, d.head_dim
        g0 = (r // ranks) * (per + 2) * dh
        q0 = g0 + (r % ranks) * d.heads * dh
        return (slice(q0, q0 + d.heads * dh), slice(g0 + per * dh, g0 + (per + 1) * dh),
                slice(g0 + (per + 1) * dh, g0 + (per + 2) * dh))

    def _own_group(self, full: np.ndarray) -> np.ndarray:
        """[rows, q | k | v] of this rank out of the gathered grouped QKV output."""
        return np.concatenate([full[:, s] for s in self._group_columns()], axis=1)

    def _grouped_grad(self, dqkv: np.ndarray) -> np.ndarray:
        """The rank's [rows, q | k | v] gradient placed at its columns of the grouped
        output (zeros elsewhere), for the reduce-scatter."""
        out = np.zeros((self.d.rows, self.d.gathered), dqkv.dtype)
        lo = 0
        for s in self._group_columns():
            out[:, s] = dqkv[:, lo:lo + s.stop - s.start]
            lo += s.stop - s.start
        return out

    # -- costs --------------------------------------------------------------------------------
    def _attn_shape(self) -> AttnShape:
        return core_shape(self.d, self.cfg, self.E.e, self.d.head_dim)

    def _charge_core(self, backward: bool, suffix: str = "") -> None:
        """The attention core's kernels of one pass, and the copies around them."""
        E = self.E
        name = f"{self.tag}.attn" + (".bwd" if backward else suffix)
        E.attention(name, self._attn_shape(), self.cfg.attention, backward)
        if self.cfg.attention != "flash":
            for tag, cost in self._layout_costs(backward):
                E.kernel(f"{name}.{tag}", cost)

    def _layout_costs(self, backward: bool) -> list[tuple[str, Cost]]:
        """The copies Megatron-LM's attention around its batched GEMMs makes (megatron/model/
        transformer.py at de593298, CoreAttention.forward and ParallelAttention.forward):
        forward, the context [b, np, sq, hn] made contiguous as [sq, b, np, hn]
        (`permute(2, 0, 1, 3).contiguous()`); backward, the baddbmm's alpha = 1 / norm_factor
        applied to the query and key gradients by two kernels of PyTorch's autograd (fused
        kernels: the unfused chain scales the scores instead), and the split of the fused
        QKV output undone by one concatenation of the three gradients. Under selective
        recomputation the attention core's three input gradients are also cloned: the
        checkpoint's backward collects them in its detached inputs' `.grad` (megatron/mpu/
        random.py at de593298, CheckpointFunction.backward), and PyTorch's AccumulateGrad
        copies a gradient to the layout a leaf asks for (contiguous for the strided q, k, v
        views of the fused QKV output, while the batched GEMMs' gradients come transposed).
        With grouped-query attention the KV heads are repeated for the batched GEMMs
        (Megatron-Core's unfused attention, `repeat_interleave`) and their gradients summed
        back."""
        d, e = self.d, self.E.e
        n = d.rows * d.attn_width                 # elements of q (and of a repeated k, v)
        nkv = d.rows * d.kv_heads * d.head_dim    # elements of the k and v kept
        grouped = nkv < n
        if not backward:
            rep = [("kv.repeat", Cost(0, 2 * nkv * e, 2 * n * e))] if grouped else []
            return rep + [("context.permute", Cost(0, n * e, n * e))]
        scale = [(f"{x}.alpha", Cost(n, n * e, n * e)) for x in ("dq", "dk")]
        fold = [("kv.repeat.bwd", Cost(2 * n, 2 * n * e, 2 * nkv * e))] if grouped else []
        clone = [(f"{x}.checkpoint", Cost(0, m * e, m * e))
                 for x, m in (("dq", n), ("dk", nkv), ("dv", nkv))]
        return (scale if self.E.kernels.mode == "fused" else []) + fold + \
            (clone if self.selective else []) + \
            [("qkv.split", Cost(0, (n + 2 * nkv) * e, (n + 2 * nkv) * e))]

    def _bias_epilogue(self, width: int) -> Epilogue:
        """A bias added in the GEMM's cuBLASLt epilogue (BIAS) under train.fuse_epilogues:
        one add per output element and the bias read; none otherwise."""
        if not self.E.kernels.fuse_epilogues or not self.cfg.bias:
            return NO_EPILOGUE
        return Epilogue(out_flops=1, extra_read_bytes=width * self.E.e)

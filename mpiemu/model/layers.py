"""One transformer layer of one TP rank: Megatron tensor parallelism, optional SP.

Column-parallel QKV and FC-1, row-parallel output projection (OP) and FC-2, heads split
contiguously (thesis 2.3.3, 4.5.1). Without SP the four serialized all-reduces of a layer
follow OP and FC-2 in forward and the FC-1 and QKV input-gradient GEMMs in backward, each
of (bytes per element) x H x SL x B (thesis Eq. 5.5). With SP each becomes a reduce-scatter
after the row-parallel GEMM and an all-gather before the column-parallel one (swapped in
backward), and LayerNorm, dropout and residuals run on the rank's sequence rows
(Korthikanti et al. 2022). Activations are [S*B, H], sequence first (Megatron).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..devices.attention_gpu import AttnShape
from ..devices.gemm import NO_EPILOGUE, Epilogue
from . import attention as attn
from .config import ModelConfig
from .dims import Dims
from .executor import Array, Executor, Ready
from .masks import Masks
from .ops import (GELU_FLOPS, Cost, bias_add_cost, bias_dropout_add, bias_gelu, bias_gelu_back,
                  bias_gelu_cost, bias_grad_cost, dropout, dropout_add_cost, layernorm,
                  layernorm_back, layernorm_cost)

Params = dict[str, Array]
Cache = dict[str, Any]

# Megatron-LM's fused softmax runs for half-precision scores of at most this many keys, else
# torch's softmax (megatron/model/fused_softmax.py at de593298, is_kernel_available)
FUSED_SOFTMAX_MAX_KEYS = 4096


def _t(a: Array) -> Array:
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


def _bias_dropout_back(dy: np.ndarray, keep: np.ndarray | None, p: float
                       ) -> tuple[np.ndarray, np.ndarray]:
    da = dropout(dy, keep, p)
    return da, da.sum(0)


class Layer:
    """Forward and backward of layer `index` on one rank (pre-LN GPT or post-LN BERT)."""

    def __init__(self, ex: Executor, cfg: ModelConfig, dims: Dims, index: int,
                 recompute: str = "none") -> None:
        self.E, self.cfg, self.d, self.i = ex, cfg, dims, index
        self.p, self.tag = f"layers.{index}.", f"l{index}"
        # selective: the attention core's S x S tensors are dropped after forward and
        # recomputed in backward (Korthikanti et al. 2022, 4.2); flash keeps none anyway
        self.selective = recompute == "selective" and cfg.attention != "flash"

    # -- forward ----------------------------------------------------------------------------
    def forward(self, x: Array, P: Params, masks: Masks) -> tuple[Array, Cache]:
        return self.E.layer_pass(self.tag, self.p, "fwd", lambda _: self._forward(x, P, masks),
                                 (None, {}))

    def _forward(self, x: Array, P: Params, masks: Masks) -> tuple[Array, Cache]:
        x, ca = self._sublayer(x, P, masks, "attn")
        x, cm = self._sublayer(x, P, masks, "mlp")
        return x, {"attn": ca, "mlp": cm}

    def _ln(self, name: str, x: Array, P: Params) -> tuple[Array, Any]:
        d, E = self.d, self.E
        res = E.kernel(f"{self.tag}.{name}.fwd", layernorm_cost(d.shard_rows, d.hidden, E.e),
                       layernorm, x, P[self.p + name + ".g"], P[self.p + name + ".b"],
                       self.cfg.layernorm_eps)
        return res if res is not None else (None, None)

    def _sublayer(self, x: Array, P: Params, masks: Masks, which: str) -> tuple[Array, Cache]:
        """pre-LN: x + DR(F(LN(x))); post-LN: LN(x + DR(F(x))) (thesis 2.2.2 Add & Norm)."""
        ln, bias, site = ("ln1", "proj.b", "attn_out") if which == "attn" else \
            ("ln2", "fc2.b", "mlp_out")
        fn = self._attention if which == "attn" else self._mlp
        d, E, pdrop = self.d, self.E, self.cfg.hidden_dropout
        keep = masks.hidden(self.i, site)
        c: Cache = {} if keep is None else {"keep": keep}
        bda = dropout_add_cost(d.shard_rows, d.hidden, E.e, pdrop > 0, mode=E.kernels.mode)
        name = f"{self.tag}.{which}.bias_dropout_add"
        if self.cfg.norm == "pre":
            y, c["ln"] = self._ln(ln, x, P)
            a, c["f"] = fn(y, P, masks)
            return E.kernel(name, bda, bias_dropout_add, x, a, P[self.p + bias], keep, pdrop), c
        a, c["f"] = fn(x, P, masks)
        s = E.kernel(name, bda, bias_dropout_add, x, a, P[self.p + bias], keep, pdrop)
        out, c["ln"] = self._ln(ln, s, P)
        return out, c

    def _heads(self, qkv: np.ndarray) -> list[np.ndarray]:
        d = self.d
        t = qkv.reshape(d.seq, d.batch, 3, d.heads, d.head_dim)      # (S, B, 3, hl, dh)
        return [np.ascontiguousarray(t[:, :, j].transpose(1, 2, 0, 3)) for j in range(3)]

    def _merge(self, o: np.ndarray) -> np.ndarray:
        d = self.d
        return o.transpose(2, 0, 1, 3).reshape(d.rows, d.attn_width)  # (S*B, hl*dh)

    def _attention(self, y: Array, P: Params, masks: Masks) -> tuple[Array, Cache]:
        d, E, cfg, p = self.d, self.E, self.cfg, self.p
        w = d.attn_width
        epi = self._bias_epilogue(3 * w)
        qkv, _ = E.column_parallel(f"{self.tag}.qkv.fwd", y, P[p + "qkv.w"], d.rows, 3 * w,
                                   d.hidden, epi)
        # Megatron-LM adds the QKV bias after the GEMM (megatron/mpu/layers.py at de593298,
        # LinearWithGradAccumulationAndAsyncCommunication.forward, lines 235-237)
        qkv = E.kernel(f"{self.tag}.qkv.bias", [] if epi != NO_EPILOGUE else
                       bias_add_cost(d.rows, 3 * w, E.e), np.add, qkv, P[p + "qkv.b"])
        c: Cache = {"h": y}       # the input (its sequence shard under SP: gathered again)
        if E.on:
            assert qkv is not None
            q, k, v = self._heads(qkv)
            o, c["attn"] = attn.forward(cfg.attention, q, k, v, cfg.causal,
                                        lambda: masks.probs(self.i), cfg.attention_dropout,
                                        cfg.attention_block)
            c["ctx"] = self._merge(o)
            if self.selective:
                c["attn"] = {key: c["attn"][key] for key in ("q", "k", "v")}
        self._charge_attention(backward=False)
        a = E.row_parallel(f"{self.tag}.proj.fwd", c.get("ctx"), P[p + "proj.w"], d.rows,
                           d.hidden, w)
        return a, c

    def _attn_shape(self) -> AttnShape:
        d, cfg = self.d, self.cfg
        return AttnShape(d.batch * d.heads, d.seq, d.seq, d.head_dim, self.E.e,
                         dropout=cfg.attention_dropout > 0, causal=cfg.causal, training=True,
                         triangle=self.E.e < 4 and d.seq <= FUSED_SOFTMAX_MAX_KEYS)

    def _charge_attention(self, backward: bool, suffix: str = "") -> None:
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
        views of the fused QKV output, while the batched GEMMs' gradients come transposed)."""
        n, e = self.d.rows * self.d.attn_width, self.E.e      # elements of one of q, k, v
        if not backward:
            return [("context.permute", Cost(0, n * e, n * e))]
        scale = [(f"{x}.alpha", Cost(n, n * e, n * e)) for x in ("dq", "dk")]
        clone = [(f"{x}.checkpoint", Cost(0, n * e, n * e)) for x in ("dq", "dk", "dv")]
        return (scale if self.E.kernels.mode == "fused" else []) + \
            (clone if self.selective else []) + [("qkv.split", Cost(0, 3 * n * e, 3 * n * e))]

    def _bias_epilogue(self, width: int) -> Epilogue:
        """A bias added in the GEMM's cuBLASLt epilogue (BIAS) under train.fuse_epilogues:
        one add per output element and the bias read; none otherwise."""
        if not self.E.kernels.fuse_epilogues:
            return NO_EPILOGUE
        return Epilogue(out_flops=1, extra_read_bytes=width * self.E.e)

    def _gelu_epilogue(self, backward: bool) -> Epilogue:
        """FC-1's bias + GeLU in its GEMM's cuBLASLt epilogue (GELU_AUX_BIAS: the
        pre-activation is written for backward), or their gradients in FC-2's activation-
        gradient GEMM (DGELU_BGRAD: reads it back); none unless train.fuse_epilogues."""
        if not self.E.kernels.fuse_epilogues:
            return NO_EPILOGUE
        d, e = self.d, self.E.e
        aux = d.rows * d.ffn * e
        if backward:
            return Epilogue(out_flops=2 * GELU_FLOPS + 1, out_sfu=1.0, extra_read_bytes=aux,
                            extra_write_bytes=d.ffn * e)
        return Epilogue(out_flops=GELU_FLOPS + 1, out_sfu=1.0, extra_read_bytes=d.ffn * e,
                        extra_write_bytes=aux)

    def _mlp(self, y: Array, P: Params, masks: Masks) -> tuple[Array, Cache]:
        d, E, p = self.d, self.E, self.p
        epi = self._gelu_epilogue(backward=False)
        f, _ = E.column_parallel(f"{self.tag}.fc1.fwd", y, P[p + "fc1.w"], d.rows, d.ffn,
                                 d.hidden, epi)
        cost = [] if epi != NO_EPILOGUE else bias_gelu_cost(d.rows, d.ffn, E.e,
                                                            mode=E.kernels.mode)
        res = E.kernel(f"{self.tag}.gelu.fwd", cost, bias_gelu, f, P[p + "fc1.b"])
        x, g = res if res is not None else (None, None)
        m = E.row_parallel(f"{self.tag}.fc2.fwd", g, P[p + "fc2.w"], d.rows, d.hidden, d.ffn)
        return m, {"h": y, "pre_gelu": x, "gelu": g}

    # -- backward ---------------------------------------------------------------------------
    def backward(self, dx: Array, c: Cache, P: Params, G: Params, masks: Masks,
                 ready: Ready) -> Array:
        return self.E.layer_pass(self.tag, self.p, "bwd",
                                 lambda r: self._backward(dx, c, P, G, masks, r), None, ready)

    def _backward(self, dx: Array, c: Cache, P: Params, G: Params, masks: Masks,
                  ready: Ready) -> Array:
        dx = self._sublayer_back(dx, c["mlp"], P, G, masks, "mlp", ready)
        return self._sublayer_back(dx, c["attn"], P, G, masks, "attn", ready)

    def _ln_back(self, name: str, dy: Array, c: Any, P: Params, G: Params,
                 ready: Ready) -> Array:
        d, E, p = self.d, self.E, self.p
        res = E.kernel(f"{self.tag}.{name}.bwd",
                       layernorm_cost(d.shard_rows, d.hidden, E.e, backward=True),
                       layernorm_back, dy, c, P[p + name + ".g"])
        dx, dg, db = res if res is not None else (None,) * 3
        acc(G, p + name + ".g", dg)
        acc(G, p + name + ".b", db)
        ready([p + name + ".g", p + name + ".b"])
        return dx

    def _residual(self, name: str, a: Array, b: Array) -> Array:
        d, E = self.d, self.E
        n = d.shard_rows * d.hidden
        return E.kernel(f"{self.tag}.{name}.residual.bwd", Cost(n, 2 * n * E.e, n * E.e),
                        np.add, a, b)

    def _sublayer_back(self, dy: Array, c: Cache, P: Params, G: Params, masks: Masks,
                       which: str, ready: Ready) -> Array:
        ln, bias = ("ln1", "proj.b") if which == "attn" else ("ln2", "fc2.b")
        back = self._attention_back if which == "attn" else self._mlp_back
        d, E, pdrop = self.d, self.E, self.cfg.hidden_dropout
        bda = dropout_add_cost(d.shard_rows, d.hidden, E.e, pdrop > 0, backward=True,
                               mode=E.kernels.mode)
        name = f"{self.tag}.{which}.bias_dropout_add.bwd"
        if self.cfg.norm == "post":
            dy = self._ln_back(ln, dy, c["ln"], P, G, ready)
        res = E.kernel(name, bda, _bias_dropout_back, dy, c.get("keep"), pdrop)
        da, dbias = res if res is not None else (None, None)
        acc(G, self.p + bias, dbias)
        dF = back(da, c["f"], P, G, masks, [self.p + bias], ready)
        if self.cfg.norm == "pre":
            dF = self._ln_back(ln, dF, c["ln"], P, G, ready)
        return self._residual(which, dy, dF)

    def _attention_back(self, da: Array, c: Cache, P: Params, G: Params, masks: Masks,
                        with_bias: list[str], ready: Ready) -> Array:
        d, E, cfg, p = self.d, self.E, self.cfg, self.p
        w = d.attn_width
        dctx, da_full = E.column_parallel(f"{self.tag}.proj.bwd", da, _t(P[p + "proj.w"]),
                                          d.rows, w, d.hidden)
        acc(G, p + "proj.w", E.wgrad(f"{self.tag}.proj.wgrad", _t(c.get("ctx")), da_full, w,
                                    d.hidden, d.rows))
        ready([p + "proj.w"] + with_bias)
        dqkv = None
        if E.on:
            assert dctx is not None
            do = np.ascontiguousarray(dctx.reshape(d.seq, d.batch, d.heads, d.head_dim)
                                      .transpose(1, 2, 0, 3))           # (B, hl, S, dh)
            a = c["attn"]
            if self.selective:        # the attention core again, from the kept q, k, v
                a = attn.forward(cfg.attention, a["q"], a["k"], a["v"], cfg.causal,
                                 lambda: masks.probs(self.i), cfg.attention_dropout,
                                 cfg.attention_block)[1]
            if cfg.attention != "flash":
                grads = attn.dense_back(do, a, cfg.attention_dropout)
            else:
                o = c["ctx"].reshape(d.seq, d.batch, d.heads, d.head_dim).transpose(1, 2, 0, 3)
                grads = attn.flash_backward(do, o, c["attn"], cfg.causal,
                                            lambda: masks.probs(self.i),
                                            cfg.attention_dropout, cfg.attention_block)
            dqkv = np.concatenate([self._merge(g) for g in grads], axis=1)   # (S*B, 3 hl dh)
        if self.selective:
            with E.labelled(phase="recompute"):
                self._charge_attention(backward=False, suffix=".recompute")
        self._charge_attention(backward=True)
        acc(G, p + "qkv.b", E.kernel(f"{self.tag}.qkv.bias_grad",
                                     bias_grad_cost(d.rows, 3 * w, E.e), np.sum, dqkv, 0))
        dx, dw = E.column_parallel_back(f"{self.tag}.qkv", dqkv, _t(P[p + "qkv.w"]), c["h"],
                                        d.rows, d.hidden, 3 * w)
        acc(G, p + "qkv.w", dw)
        ready([p + "qkv.w", p + "qkv.b"])
        return dx

    def _mlp_back(self, dm: Array, c: Cache, P: Params, G: Params, masks: Masks,
                  with_bias: list[str], ready: Ready) -> Array:
        d, E, p = self.d, self.E, self.p
        epi = self._gelu_epilogue(backward=True)
        dg, dm_full = E.column_parallel(f"{self.tag}.fc2.bwd", dm, _t(P[p + "fc2.w"]), d.rows,
                                        d.ffn, d.hidden, epi)
        acc(G, p + "fc2.w", E.wgrad(f"{self.tag}.fc2.wgrad", _t(c["gelu"]), dm_full, d.ffn,
                                   d.hidden, d.rows))
        ready([p + "fc2.w"] + with_bias)
        cost = [] if epi != NO_EPILOGUE else bias_gelu_cost(d.rows, d.ffn, E.e, True)
        res = E.kernel(f"{self.tag}.gelu.bwd", cost, bias_gelu_back, dg, c["pre_gelu"])
        df, db = res if res is not None else (None, None)
        acc(G, p + "fc1.b", db)
        dx, dw = E.column_parallel_back(f"{self.tag}.fc1", df, _t(P[p + "fc1.w"]), c["h"],
                                        d.rows, d.hidden, d.ffn)
        acc(G, p + "fc1.w", dw)
        ready([p + "fc1.w", p + "fc1.b"])
        return dx

"""One transformer layer of one TP rank: Megatron tensor parallelism, optional SP.

Column-parallel QKV and FC-1, row-parallel output projection (OP) and FC-2, heads split
contiguously (thesis 2.3.3, 4.5.1; `self_attention.py`, `mlp.py`). Without SP the four
serialized all-reduces of a layer follow OP and FC-2 in forward and the FC-1 and QKV
input-gradient GEMMs in backward, each of (bytes per element) x H x SL x B (thesis Eq. 5.5).
With SP each becomes a reduce-scatter after the row-parallel GEMM and an all-gather before
the column-parallel one (swapped in backward), and the norms, dropout and residuals run on
the rank's sequence rows (Korthikanti et al. 2022). The norms are LayerNorm (GPT, BERT) or
RMSNorm (Llama), before each sub-layer (pre) or after its residual add (post). Activations
are [S*B, H], sequence first (Megatron).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .block import Block, Cache, Params, acc, norm_backward, norm_forward
from .config import ModelConfig
from .dims import Dims
from .executor import Array, Executor, Ready
from .masks import Masks
from .mlp import Mlp
from .moe.layer import MoeMlp
from .moe.state import MoeRun
from .ops import Cost, bias_dropout_add, dropout, dropout_add_cost
from .latent_attention import LatentAttention
from .self_attention import SelfAttention
from .steps import Steps, drain


def _bias_dropout_back(dy: np.ndarray, keep: np.ndarray | None, p: float
                       ) -> tuple[np.ndarray, np.ndarray]:
    da = dropout(dy, keep, p)
    return da, da.sum(0)


class Layer(Block):
    """Forward and backward of layer `index` on one rank (pre-norm GPT / Llama, post-LN BERT)."""

    def __init__(self, ex: Executor, cfg: ModelConfig, dims: Dims, index: int,
                 recompute: str = "none", positions: np.ndarray | None = None,
                 cp_comm: str = "p2p", moe: MoeRun | None = None) -> None:
        super().__init__(ex, cfg, dims, index, recompute, positions, cp_comm)
        kind = LatentAttention if cfg.mla else SelfAttention          # MLA (DeepSeek-V3)
        self.attention: SelfAttention | LatentAttention = kind(ex, cfg, dims, index, recompute,
                                                                positions, cp_comm)
        self.mlp: Mlp | MoeMlp = Mlp(ex, cfg, dims, index, recompute)
        if cfg.moe is not None and cfg.moe.is_moe(index):     # experts in place of the MLP
            assert moe is not None
            self.mlp = MoeMlp(ex, cfg, dims, index, moe, positions)

    # -- forward ----------------------------------------------------------------------------
    def forward(self, x: Array, P: Params, masks: Masks) -> tuple[Array, Cache]:
        return drain(self.forward_steps(x, P, masks))

    def forward_steps(self, x: Array, P: Params, masks: Masks) -> Steps[tuple[Array, Cache]]:
        """The forward pass as steps (yielding while an expert all-to-all moves)."""
        return self.E.layer_steps(self.tag, self.p, "fwd",
                                  lambda _: self._forward(x, P, masks), (None, {}))

    def _forward(self, x: Array, P: Params, masks: Masks) -> Steps[tuple[Array, Cache]]:
        x, ca = yield from self._sublayer(x, P, masks, "attn")
        x, cm = yield from self._sublayer(x, P, masks, "mlp")
        return x, {"attn": ca, "mlp": cm}

    def _norm(self, name: str, x: Array, P: Params) -> tuple[Array, Any]:
        return norm_forward(self.E, self.cfg, self.p + name, f"{self.tag}.{name}", x, P,
                            self.d.shard_rows)

    def _sublayer(self, x: Array, P: Params, masks: Masks, which: str
                  ) -> Steps[tuple[Array, Cache]]:
        """pre-norm: x + DR(F(N(x))); post-norm: N(x + DR(F(x))) (thesis 2.2.2 Add & Norm)."""
        ln, bias, site = ("ln1", "proj.b", "attn_out") if which == "attn" else \
            ("ln2", "fc2.b", "mlp_out")
        d, E, cfg = self.d, self.E, self.cfg
        keep = masks.hidden(self.i, site)
        c: Cache = {} if keep is None else {"keep": keep}
        bda = dropout_add_cost(d.shard_rows, d.hidden, E.e, cfg.hidden_dropout > 0,
                               mode=E.kernels.mode, bias=cfg.bias)
        name = f"{self.tag}.{which}.bias_dropout_add"
        b = P.get(self.p + bias)
        if cfg.norm == "pre":
            y, c["ln"] = self._norm(ln, x, P)
            a, c["f"] = yield from self._inner(which, y, P, masks)
            # the residual stream is a tensor of the numerics' dtype (Megatron: bf16)
            return E.round(E.kernel(name, bda, bias_dropout_add, x, a, b, keep,
                                    cfg.hidden_dropout)), c
        a, c["f"] = yield from self._inner(which, x, P, masks)
        s = E.round(E.kernel(name, bda, bias_dropout_add, x, a, b, keep, cfg.hidden_dropout))
        out, c["ln"] = self._norm(ln, s, P)
        return out, c

    def _inner(self, which: str, y: Array, P: Params, masks: Masks
               ) -> Steps[tuple[Array, Cache]]:
        if which == "attn":
            return self.attention.forward(y, P, masks)
        if isinstance(self.mlp, MoeMlp):
            return (yield from self.mlp.forward_steps(y, P, masks))
        return self.mlp.forward(y, P)

    # -- backward ---------------------------------------------------------------------------
    def backward(self, dx: Array, c: Cache, P: Params, G: Params, masks: Masks,
                 ready: Ready) -> Array:
        return drain(self.backward_steps(dx, c, P, G, masks, ready))

    def backward_steps(self, dx: Array, c: Cache, P: Params, G: Params, masks: Masks,
                       ready: Ready) -> Steps[Array]:
        """The backward pass as steps (yielding while an expert all-to-all moves)."""
        return self.E.layer_steps(self.tag, self.p, "bwd",
                                  lambda r: self._backward(dx, c, P, G, masks, r), None, ready)

    def _backward(self, dx: Array, c: Cache, P: Params, G: Params, masks: Masks,
                  ready: Ready) -> Steps[Array]:
        dx = yield from self._sublayer_back(dx, c["mlp"], P, G, masks, "mlp", ready)
        return (yield from self._sublayer_back(dx, c["attn"], P, G, masks, "attn", ready))

    def _norm_back(self, name: str, dy: Array, c: Any, P: Params, G: Params,
                   ready: Ready) -> Array:
        return norm_backward(self.E, self.cfg, self.p + name, f"{self.tag}.{name}", dy, c, P, G,
                             self.d.shard_rows, ready)

    def _residual(self, name: str, a: Array, b: Array) -> Array:
        d, E = self.d, self.E
        n = d.shard_rows * d.hidden
        return E.round(E.kernel(f"{self.tag}.{name}.residual.bwd",
                                Cost(n, 2 * n * E.e, n * E.e), np.add, a, b))

    def _sublayer_back(self, dy: Array, c: Cache, P: Params, G: Params, masks: Masks,
                       which: str, ready: Ready) -> Steps[Array]:
        ln, bias = ("ln1", "proj.b") if which == "attn" else ("ln2", "fc2.b")
        d, E, cfg = self.d, self.E, self.cfg
        bda = dropout_add_cost(d.shard_rows, d.hidden, E.e, cfg.hidden_dropout > 0,
                               backward=True, mode=E.kernels.mode, bias=cfg.bias)
        name = f"{self.tag}.{which}.bias_dropout_add.bwd"
        if cfg.norm == "post":
            dy = self._norm_back(ln, dy, c["ln"], P, G, ready)
        res = E.kernel(name, bda, _bias_dropout_back, dy, c.get("keep"), cfg.hidden_dropout)
        da, dbias = res if res is not None else (None, None)
        with_bias = self.biases(bias)
        if with_bias:
            acc(G, with_bias[0], dbias)
        if which == "attn":
            dF = self.attention.backward(da, c["f"], P, G, masks, with_bias, ready)
        elif isinstance(self.mlp, MoeMlp):
            dF = yield from self.mlp.backward_steps(da, c["f"], P, G, with_bias, ready)
        else:
            dF = self.mlp.backward(da, c["f"], P, G, with_bias, ready)
        if cfg.norm == "pre":
            dF = self._norm_back(ln, dF, c["ln"], P, G, ready)
        return self._residual(which, dy, dF)

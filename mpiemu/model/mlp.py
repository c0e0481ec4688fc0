"""A layer's MLP on one TP rank: column-parallel FC-1, the activation, row-parallel FC-2.

GPT / BERT: FC-1 (+ bias), GeLU (Megatron's fused bias_gelu, or in the GEMMs' cuBLASLt
epilogues under `train.fuse_epilogues`), FC-2 (thesis 2.2.2, 4.5.1). Llama: FC-1 is the
gate and the up projection fused side by side ([gate_r | up_r] per rank, Megatron-Core's
`linear_fc1` with `gated_linear_unit`), SwiGLU silu(gate) x up (Megatron-Core's fused
`bias_swiglu`), FC-2; no biases. Activations are [S*B, width], sequence first.
"""
from __future__ import annotations

from ..devices.gemm import NO_EPILOGUE, Epilogue
from .block import Block, Cache, Params, acc, transposed
from .executor import Array, Ready
from .ops import (GELU_FLOPS, bias_gelu, bias_gelu_back, bias_gelu_cost, swiglu, swiglu_back,
                  swiglu_cost)


class Mlp(Block):
    """Forward and backward of layer `index`'s MLP on one rank."""

    def forward(self, y: Array, P: Params) -> tuple[Array, Cache]:
        d, E, p = self.d, self.E, self.p
        epi = self._gelu_epilogue(backward=False)
        width = 2 * d.ffn if self.cfg.gated else d.ffn
        f, _ = E.column_parallel(f"{self.tag}.fc1.fwd", y, P[p + "fc1.w"], d.rows, width,
                                 d.hidden, epi)
        res = E.kernel(f"{self.tag}.{self.cfg.activation}.fwd", self._act_cost(epi, False),
                       swiglu if self.cfg.gated else bias_gelu, f, P.get(p + "fc1.b"))
        x, g = res if res is not None else (None, None)
        g = E.round(g)                  # the activation's output, stored in the dtype
        m = E.row_parallel(f"{self.tag}.fc2.fwd", g, P[p + "fc2.w"], d.rows, d.hidden, d.ffn)
        return m, {"h": y, "pre_act": x, "act": g}

    def backward(self, dm: Array, c: Cache, P: Params, G: Params, with_bias: list[str],
                 ready: Ready) -> Array:
        d, E, p = self.d, self.E, self.p
        epi = self._gelu_epilogue(backward=True)
        dg, dm_full = E.column_parallel(f"{self.tag}.fc2.bwd", dm, transposed(P[p + "fc2.w"]),
                                        d.rows, d.ffn, d.hidden, epi)
        acc(G, p + "fc2.w", E.wgrad(f"{self.tag}.fc2.wgrad", transposed(c["act"]), dm_full,
                                   d.ffn, d.hidden, d.rows))
        ready([p + "fc2.w"] + with_bias)
        res = E.kernel(f"{self.tag}.{self.cfg.activation}.bwd", self._act_cost(epi, True),
                       swiglu_back if self.cfg.gated else bias_gelu_back, dg, c["pre_act"])
        df, db = res if res is not None else (None, None)
        df = E.round(df)
        fc1_b = self.biases("fc1.b")
        if fc1_b:
            acc(G, fc1_b[0], db)
        width = 2 * d.ffn if self.cfg.gated else d.ffn
        dx, dw = E.column_parallel_back(f"{self.tag}.fc1", df, transposed(P[p + "fc1.w"]),
                                        c["h"], d.rows, d.hidden, width)
        acc(G, p + "fc1.w", dw)
        ready([p + "fc1.w"] + fc1_b)
        return dx

    def _act_cost(self, epi: Epilogue, backward: bool) -> list:  # type: ignore[type-arg]
        """The activation's kernels: none when in the GEMMs' epilogues."""
        d, E = self.d, self.E
        if epi != NO_EPILOGUE:
            return []
        if self.cfg.gated:
            return swiglu_cost(d.rows, d.ffn, E.e, E.kernels.mode, self.cfg.bias, backward)
        mode = "fused" if backward else E.kernels.mode     # one gelu_backward in both stacks
        return bias_gelu_cost(d.rows, d.ffn, E.e, backward, mode, self.cfg.bias)

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

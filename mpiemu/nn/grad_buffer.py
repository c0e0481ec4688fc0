"""Megatron-LM's gradient buffer: how each micro-batch's gradients reach `main_grad`.

Megatron-LM's mixed-precision training (Adam on the GPU over fp16 / bf16 weights, `local`
DDP, its default) keeps every parameter's gradient in one contiguous buffer, `main_grad`,
and hooks each parameter's gradient accumulator (megatron/model/distributed.py at de593298,
`_make_param_hook`): `param.main_grad.add_(param.grad.data)` whenever autograd produces a
gradient, so once per parameter and micro-batch, one element-wise kernel that reads the
gradient and the buffer and writes the buffer (zeroed once per iteration by the optimizer,
`adam.mixed_precision_passes`).

With gradient accumulation fusion (`--gradient-accumulation-fusion`, Megatron-LM 83b1e42f,
2022-02-13: megatron/fused_kernels/fused_weight_gradient_dense.cu) the linear layers'
weight-gradient GEMMs add into `main_grad` themselves (cuBLAS beta = 1: the epilogue reads C
before writing it) and their parameters' hooks find no gradient. At de593298 the fusion
needed fp32 accumulation (megatron/arguments.py lines 178-188), which only bf16 forced, so
fp16 runs of 2022 used the hooks for every parameter; fp16 fusion came on 2022-09-27
(07916bf2) and is Megatron's default since.

The buffer is kept in the model's dtype here, as the DP reduction and the memory report
keep gradients (Megatron accumulates bf16 gradients in fp32: not modelled).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..hw.gemm import NO_EPILOGUE, Epilogue
from .config import OptimizerConfig
from .ops import Cost


def megatron_optimizer(opt: OptimizerConfig) -> bool:
    """Whether a GPU rank's step is Megatron-LM's: Adam on the GPU (LAMB keeps the thesis's
    accounting, near-memory compute its own); mixed precision when the weights are half."""
    return opt.name == "adam" and opt.on != "nmc"


@dataclass(frozen=True)
class GradBuffer:
    """The `main_grad` buffer of a rank whose elements are `e` bytes."""

    e: int
    fused_wgrad: bool = True          # weight-gradient GEMMs accumulate in their epilogue

    def wgrad_epilogue(self, rows: int, cols: int) -> Epilogue:
        """A weight-gradient GEMM's [rows, cols] output added into the buffer (beta = 1):
        C is read before it is written. Unfused, the GEMM writes the gradient alone."""
        return Epilogue(extra_read_bytes=rows * cols * self.e) if self.fused_wgrad \
            else NO_EPILOGUE

    def hook_cost(self, n: int) -> Cost:
        """`main_grad.add_(grad)` over n elements: read both, write the buffer."""
        return Cost(n, 2 * n * self.e, n * self.e)

    def hooked(self, from_gemm: bool) -> bool:
        """Whether a gradient reaches the buffer through the hook's kernel (always, but for
        a weight-gradient GEMM's when that GEMM accumulates itself)."""
        return not (from_gemm and self.fused_wgrad)

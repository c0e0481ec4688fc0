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

The buffer keeps the model's dtype for fp16 and fp32 weights and fp32 for bf16 ones
(`adam.main_grad_bytes`); the DP reduction, the SP and tied-embedding gradient all-reduces
and the memory report carry gradients in the buffer's dtype, as Megatron reduces `main_grad`.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..devices.gemm import NO_EPILOGUE, Epilogue
from ..devices.specs import dtype_bytes
from .adam import MASTER_BYTES, main_grad_bytes
from .config import OptimizerConfig
from ..model.ops import Cost


def megatron_optimizer(opt: OptimizerConfig) -> bool:
    """Whether a GPU rank's step is Megatron-LM's: Adam on the GPU (LAMB keeps the thesis's
    accounting, near-memory compute its own); mixed precision when the weights are half."""
    return opt.name == "adam" and opt.on != "nmc"


@dataclass(frozen=True)
class GradBuffer:
    """The `main_grad` buffer of a rank: gradients of `e` bytes into elements of `main`."""

    e: int                            # a gradient as autograd computes it (model dtype)
    main: int                         # a buffer element
    fused_wgrad: bool = True          # weight-gradient GEMMs accumulate in their epilogue

    @classmethod
    def megatron(cls, dtype: str, fused_wgrad: bool) -> GradBuffer | None:
        """The buffer of Megatron-LM's mixed-precision stack; None for fp32 weights."""
        e = dtype_bytes(dtype)
        return cls(e, main_grad_bytes(dtype), fused_wgrad) if e < MASTER_BYTES else None

    def wgrad_epilogue(self, rows: int, cols: int) -> Epilogue:
        """A weight-gradient GEMM's [rows, cols] output added into the buffer (beta = 1):
        C is read before it is written, in the buffer's dtype (the GEMM's own output counts
        the model's). Unfused, the GEMM writes the gradient alone."""
        c = rows * cols
        return Epilogue(extra_read_bytes=c * self.main,
                        extra_write_bytes=c * (self.main - self.e)) if self.fused_wgrad \
            else NO_EPILOGUE

    def hook_cost(self, n: int) -> Cost:
        """`main_grad.add_(grad)` over n elements: read both, write the buffer."""
        return Cost(n, n * (self.e + self.main), n * self.main)

    def hooked(self, from_gemm: bool) -> bool:
        """Whether a gradient reaches the buffer through the hook's kernel (always, but for
        a weight-gradient GEMM's when that GEMM accumulates itself)."""
        return not (from_gemm and self.fused_wgrad)

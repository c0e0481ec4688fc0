"""GEMMs as tensor cores run them in a precision (modern_training.md §7.3, §7.6):

- fp64 / fp32: exact numpy;
- bf16 / fp16: both operands rounded to the format, the products accumulated in fp32
  (cuBLAS's `CUBLAS_COMPUTE_32F`), the output rounded to the format.
A transformer layer's linear GEMMs under an FP8 recipe are `fp8_gemm.Fp8Gemm`'s.
"""
from __future__ import annotations

import numpy as np

from .formats import round_to


class PrecisionGemm:
    """C = A B in a compute precision (`fp64`, `fp32`: exact numpy; `bf16`, `fp16`)."""

    def __init__(self, compute: str) -> None:
        self.compute = compute

    @property
    def exact(self) -> bool:
        """fp32 / fp64: plain numpy, nothing rounded."""
        return self.compute in ("fp32", "fp64")

    def __call__(self, name: str, a: np.ndarray, b: np.ndarray,
                 operands: tuple[str, str] = ("act", "weight")) -> np.ndarray:
        """A GEMM whose output is a tensor of the compute format (fprop, dgrad)."""
        if self.exact:
            return a @ b
        return self.round(self.accumulate(name, a, b, operands))

    def accumulate(self, name: str, a: np.ndarray, b: np.ndarray,
                   operands: tuple[str, str] = ("act", "grad")) -> np.ndarray:
        """The GEMM's fp32 accumulator, not rounded: a weight gradient accumulated straight
        into the fp32 `main_grad` (Megatron's gradient-accumulation fusion), or a partial
        sum a reduction adds to."""
        if self.exact:
            return a @ b
        return round_to(a, self.compute) @ round_to(b, self.compute)    # fp32 accumulate

    def round(self, x: np.ndarray) -> np.ndarray:
        """A tensor stored in the compute format."""
        return x if self.exact else round_to(x, self.compute)

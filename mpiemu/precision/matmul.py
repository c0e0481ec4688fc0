"""GEMMs as tensor cores run them in a precision (modern_training.md §7.3, §7.6):

- bf16 / fp16: both operands rounded to the format, the products accumulated in fp32
  (cuBLAS's `CUBLAS_COMPUTE_32F`), the output rounded to the format;
- FP8 under a recipe (`scaling.py`): both operands quantized (E4M3; gradients E5M2 under
  the HYBRID format, E4M3 under block scaling), the products of the FP8 values accumulated
  in fp32 and multiplied by the operands' inverse scales (per K block of 128 under block
  scaling: DeepSeek-V3 §3.3.2's promotion to fp32), the output in bf16 (TE's high-precision
  output).
Hopper's fast FP8 accumulation in the forward GEMM (about 14 bits, DeepSeek-V3 §3.3.2) is not
modelled: every accumulation is fp32.

An operand is an activation (`act`), a weight or a gradient (`grad`): fprop x W (act,
weight), dgrad dy W^T (grad, weight), wgrad x^T dy (act, grad). A block-scaled activation or
gradient has 1 x 128 tiles along the reduction axis (128 x 1 as the right operand), a weight
128 x 128 blocks.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .formats import amax, fmt, round_to
from .scaling import BLOCK, DelayedScaling, block_quantize, current_scale, expand, \
    tensor_quantize

OPERANDS = ("act", "weight", "grad")
RECIPES = ("delayed", "current", "block")


@dataclass(frozen=True)
class Fp8Recipe:
    """Which FP8 recipe and its knobs (TE's `DelayedScaling` defaults; Megatron's differ:
    history 1, 'most_recent')."""

    kind: str                             # delayed | current | block
    fp8_format: str = "hybrid"            # hybrid: E4M3 forward, E5M2 gradients; or e4m3
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"        # or most_recent
    margin: int = 0

    def fmt_of(self, operand: str) -> str:
        """The FP8 format an operand is cast to."""
        hybrid = self.fp8_format == "hybrid" and self.kind != "block"
        return "e5m2" if operand == "grad" and hybrid else "e4m3"


def _tile(operand: str, left: bool) -> tuple[int, int]:
    if operand == "weight":
        return (BLOCK, BLOCK)
    return (1, BLOCK) if left else (BLOCK, 1)


class PrecisionGemm:
    """C = A B in a compute precision (`fp64`, `fp32`: exact numpy; `bf16`, `fp16`) or FP8
    under a recipe; keeps the delayed recipe's per-tensor state by GEMM name and operand."""

    def __init__(self, compute: str, recipe: Fp8Recipe | None = None) -> None:
        self.compute, self.recipe = compute, recipe
        self.states: dict[tuple[str, int], DelayedScaling] = {}

    @property
    def exact(self) -> bool:
        """fp32 / fp64 without FP8: plain numpy, nothing rounded."""
        return self.recipe is None and self.compute in ("fp32", "fp64")

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
        if self.recipe is not None:
            return self._fp8(name, a, b, operands)
        return round_to(a, self.compute) @ round_to(b, self.compute)    # fp32 accumulate

    def round(self, x: np.ndarray) -> np.ndarray:
        """A tensor stored in the compute format (FP8 GEMMs output bf16)."""
        if self.exact:
            return x
        return round_to(x, "bf16" if self.recipe is not None else self.compute)

    def end_forward(self) -> None:
        """The delayed recipe's update at the end of a forward pass (autocast exit)."""
        for st in self.states.values():
            st.update()

    def _scale(self, name: str, side: int, x: np.ndarray, fp8_max: float) -> float:
        r = self.recipe
        assert r is not None
        if r.kind == "current":
            return current_scale(amax(x), fp8_max)
        st = self.states.get((name, side))
        if st is None:
            st = self.states[(name, side)] = DelayedScaling(
                fp8_max, r.amax_history_len, r.margin, r.amax_compute_algo)
        st.record(amax(x))
        return st.scale

    def _fp8(self, name: str, a: np.ndarray, b: np.ndarray,
             operands: tuple[str, str]) -> np.ndarray:
        r = self.recipe
        assert r is not None
        fa, fb = r.fmt_of(operands[0]), r.fmt_of(operands[1])
        if r.kind == "block":
            return _block_gemm(a, b, operands, fa, fb)
        sa = self._scale(name, 0, a, fmt(fa).max)
        sb = self._scale(name, 1, b, fmt(fb).max)
        acc = tensor_quantize(a, sa, fa) @ tensor_quantize(b, sb, fb)
        return acc * (np.float32(1.0 / sa) * np.float32(1.0 / sb))


def _block_gemm(a: np.ndarray, b: np.ndarray, operands: tuple[str, str], fa: str,
                fb: str) -> np.ndarray:
    """Tile-scaled FP8 GEMM: each K block's FP8 products summed, then scaled into fp32."""
    ta, tb = _tile(operands[0], True), _tile(operands[1], False)
    qa, sa = block_quantize(a, ta, fa, fmt(fa).max)
    qb, sb = block_quantize(b, tb, fb, fmt(fb).max)
    m, k = a.shape
    n = b.shape[1]
    acc = np.zeros((m, n), dtype=np.float32)
    for kb in range(-(-k // BLOCK)):
        ks = slice(kb * BLOCK, (kb + 1) * BLOCK)
        inv_a = expand(1.0 / sa[:, kb:kb + 1], ta, (m, 1))          # (M, 1)
        inv_b = expand(1.0 / sb[kb:kb + 1, :], tb, (1, n))          # (1, N)
        acc += (qa[:, ks] @ qb[ks, :]) * inv_a * inv_b
    return acc

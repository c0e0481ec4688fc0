"""What an FP8 recipe adds around a linear layer's GEMMs: the cast kernels of Transformer
Engine (modern_training.md §7.3, §8), as memory-bound kernels.

Hopper's FP8 GEMMs take only the TN layout, so TE writes each operand's FP8 copy and its
transpose in one fused cast-transpose kernel: the forward casts the input x and the weight
W (rowwise for fprop, columnwise for the backward's dgrad and wgrad), the backward casts
the output gradient dy (rowwise for dgrad, columnwise for wgrad); the wgrad GEMM reuses
copies already made. Per element a cast reads the bf16 source (2 bytes) and writes two
1-byte copies. The current recipe reads the source once more for its amax (TE's two
passes); the block recipe quantizes the rowwise and columnwise 1 x 128 tiles of x and dy
from the source separately (two reads), a weight's 128 x 128 blocks once (transposed with
their scales). The delayed recipe's amax is fused into the cast. A weight is cast at the first
micro-batch of a step only (TE caches its FP8 copies: Megatron's `is_first_microbatch`),
and not at all under FP8 parameters (cast on the master shards after the optimizer step;
ASSUMPTION: that cast, of 1/DP of the weights once a step, is not charged). A grouped GEMM
casts every expert's weight it holds (`groups`).
"""
from __future__ import annotations

from ..devices.kernels import Kernel

SOURCE_BYTES = 2       # the bf16 tensor a cast reads
FP8_BYTES = 1


def _cast(elems: int, reads: int, tag: str) -> Kernel:
    """A cast-transpose of `elems` elements reading the source `reads` times."""
    return Kernel(0.0, reads * SOURCE_BYTES * elems, 2 * FP8_BYTES * elems, tag)


def cast_kernels(recipe: str, role: str, m: int, n: int, k: int, weight: bool = True,
                 groups: int = 1) -> list[Kernel]:
    """The casts before a GEMM C[m, n] = A[m, k] B[k, n] of `role` fprop (A = x, B = W: the
    weight's only when `weight`, of `groups` experts), dgrad (A = dy) or wgrad (none: the
    copies exist)."""
    act_reads = {"delayed": 1, "current": 2, "block": 2}[recipe]
    weight_reads = {"delayed": 1, "current": 2, "block": 1}[recipe]
    if role == "fprop":
        return [_cast(m * k, act_reads, "fp8.cast_x")] + \
            ([_cast(groups * k * n, weight_reads, "fp8.cast_w")] if weight else [])
    if role == "dgrad":
        return [_cast(m * k, act_reads, "fp8.cast_dy")]
    return []

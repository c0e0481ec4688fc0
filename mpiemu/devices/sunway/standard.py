"""The baseline "standard attention" on Sunway: separate PyTorch kernels through DRAM (SWA 4.1).

Each operator (matmul, mask, softmax, dropout and their backward) runs over all CPEs with SIMD
and streams its [B, N, S, S] operands through DRAM by DMA (SWA 2.2, Algorithm 1). Byte counts
follow what PyTorch's CPU operators do (ATen's non-fused dropout draws a float noise tensor,
scales it, and multiplies); a transposed operand of a matmul is made contiguous first (SWA 4.1:
the transpose makes the first matmul slower). Memory: the live tensors of a training step.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..specs import dtype_bytes
from .gemm import REQUEST_BYTES, best_gemm
from .spec import SunwaySpec

MASK_BYTES = 1                      # bool causal mask [B, 1, S, S]


@dataclass(frozen=True)
class Kernel:
    """One baseline operator on the whole processor."""

    name: str
    time_s: float
    flops: float
    read_bytes: float
    write_bytes: float


def stream_s(sw: SunwaySpec, read: float, write: float, elems: float,
             cycles_per_elem: float) -> float:
    """An elementwise kernel over all CGs: DMA engine time vs CPE time, double-buffered."""
    cgs = sw.core_groups
    dma = (sw.dma_s(read / cgs, read / cgs / REQUEST_BYTES)
           + sw.dma_s(write / cgs, write / cgs / REQUEST_BYTES, store=True))
    cpe = sw.cycles_s(elems * cycles_per_elem / (cgs * sw.cpes_per_cg))
    return sw.launch_s + max(dma, cpe)


def _ew(sw: SunwaySpec, name: str, n: float, reads: tuple[float, ...], writes: tuple[float, ...],
        cycles: float) -> Kernel:
    """An elementwise kernel over n elements reading / writing tensors of the given bytes
    per element."""
    r, w = n * sum(reads), n * sum(writes)
    return Kernel(name, stream_s(sw, r, w, n, cycles), 0.0, r, w)


def _bmm(sw: SunwaySpec, name: str, m: int, n: int, k: int, dtype: str, batch: int,
         transpose_elems: float = 0.0) -> Kernel:
    """Batched matmul through swBLAS, after making a transposed operand contiguous."""
    g = best_gemm(sw, m, n, k, dtype, batch)
    e = dtype_bytes(dtype)
    t = g.time_s
    rw = g.dram_read_bytes
    if transpose_elems:
        t += stream_s(sw, transpose_elems * e, transpose_elems * e, transpose_elems,
                      sw.simd_stream_cycles)
        rw += transpose_elems * e
    return Kernel(name, t, g.flops, rw, g.dram_write_bytes + transpose_elems * e)


def standard_fwd_kernels(sw: SunwaySpec, b: int, nh: int, s: int, h: int, dtype: str,
                         causal: bool = True, dropout: bool = True) -> list[Kernel]:
    """matmul(Q, K^T) -> mask -> softmax -> dropout -> matmul(P, V) (SWA Algorithm 1).

    FP16 follows Megatron-LM's unfused softmax with `attention_softmax_in_fp32`: the scores
    are cast to FP32, masked and soft-maxed there, and cast back before dropout.
    """
    e = dtype_bytes(dtype)
    f = 4 if dtype == "fp16" else e
    heads = b * nh
    n = float(heads) * s * s
    simd = sw.simd_stream_cycles
    ks = [_bmm(sw, "qk", s, s, h, dtype, heads, transpose_elems=heads * s * h)]
    if f != e:
        ks.append(_ew(sw, "cast.fp32", n, (e,), (f,), simd))
    if causal:
        ks.append(_ew(sw, "mask", n, (f, MASK_BYTES), (f,), 2 * simd))
    ks.append(_ew(sw, "softmax", n, (f,), (f,), 6 * simd))
    if f != e:
        ks.append(_ew(sw, "cast.fp16", n, (f,), (e,), simd))
    if dropout:
        ks += [_ew(sw, "dropout.bernoulli", n, (), (e,), sw.rng_cycles),
               _ew(sw, "dropout.scale", n, (e,), (e,), simd),
               _ew(sw, "dropout.mul", n, (e, e), (e,), simd)]
    ks.append(_bmm(sw, "pv", s, h, s, dtype, heads))
    return ks


def standard_bwd_kernels(sw: SunwaySpec, b: int, nh: int, s: int, h: int, dtype: str,
                         causal: bool = True, dropout: bool = True) -> list[Kernel]:
    """Autograd of the forward: two matmuls per matmul, dropout, softmax and mask backward."""
    e = dtype_bytes(dtype)
    f = 4 if dtype == "fp16" else e
    heads = b * nh
    n = float(heads) * s * s
    simd = sw.simd_stream_cycles
    ks = [_bmm(sw, "dpd", s, s, h, dtype, heads, transpose_elems=heads * s * h),
          _bmm(sw, "dv", s, h, s, dtype, heads, transpose_elems=n)]
    if dropout:
        ks.append(_ew(sw, "dropout.bwd", n, (e, e), (e,), simd))
    if f != e:
        ks.append(_ew(sw, "cast.bwd.fp32", n, (e,), (f,), simd))
    ks.append(_ew(sw, "softmax.bwd", n, (f, f), (f,), 4 * simd))
    if causal:
        ks.append(_ew(sw, "mask.bwd", n, (f, MASK_BYTES), (f,), simd))
    if f != e:
        ks.append(_ew(sw, "cast.bwd.fp16", n, (f,), (e,), simd))
    ks += [_bmm(sw, "dq", s, h, s, dtype, heads),
           _bmm(sw, "dk", s, h, s, dtype, heads, transpose_elems=n)]
    return ks


def standard_footprint_bytes(b: int, nh: int, s: int, h: int, dtype: str, *,
                             training: bool = True, causal: bool = True,
                             dropout: bool = True) -> float:
    """Peak live bytes of standard attention in a training step (forward saves for backward).

    Forward: scores, masked scores, P (saved), dropout noise (saved), P dropped (saved): at most
    3 [B,N,S,S] tensors live. Backward adds dP_dropped and a contiguous transpose of P dropped
    while P, noise and P dropped are still held: 5 (4 without dropout). The peak of the step
    counts for both passes, since the forward keeps what the backward needs; without
    `training` only the forward's own peak counts.
    """
    e = dtype_bytes(dtype)
    big = float(b) * nh * s * s * e
    io = float(b) * nh * s * h * e
    peak_big = (5 if dropout else 4) if training else (3 if dropout else 2)
    mask = float(b) * s * s * MASK_BYTES if causal else 0.0
    return peak_big * big + mask + 8 * io

"""Attention on a GPU as kernels: baseline, softmax decomposition (SD), SD + fusion (SDF), and
FlashAttention-2; per-kernel DRAM traffic and time (seed 004 2.2-2.5; Dao 2023).

For S score elements (batch x heads x queries x keys per query) of e bytes:
* `baseline`: the QK^T GEMM writes S, the softmax kernel(s) read and write it, the V GEMM
  reads it: 4 S of score traffic (fused softmax; PyTorch's unfused chain adds scale and mask
  passes).
* `sd`: softmax as local softmax (LS: read S, write X' and the per-sub-vector max m' and sum
  d'), inter-sub-vector reduction (IR: read m', d', write the factors r') and global scaling
  (GS: read X', r', write Y): 6 S plus 6 S/T of statistics (seed 004 2.3, 2.5).
* `sdf`: LS in the QK^T GEMM's epilogue with T = its output tile width, GS in the V GEMM's
  prologue, IR alone: 2 S plus 6 S/T (seed 004 2.4). The epilogue's exp runs on the SFUs
  and its max / subtract / sum on the CUDA cores of the SM that owns the tile.
* `flash`: one kernel per pass, no score matrix in DRAM (`flash_cost`).
Statistics (m', d', r', LSE) are fp32. Scale and mask are fused into the QK^T GEMM in every
variant but `baseline` with unfused kernels (seed 004 2.2: they are element-wise).
Backward: sd and sdf keep the baseline's backward (the softmax gradient needs only Y, seed
004 2.8); flash has its own kernel.
"""
from __future__ import annotations

import functools
import heapq
import math
from typing import NamedTuple, Union

from . import kernels as K
from .cost import DeviceCost
from .gemm import NO_EPILOGUE, Epilogue
from .specs import DeviceSpec

VARIANTS = ("baseline", "sd", "sdf", "flash")
LS_FLOPS, GS_FLOPS, IR_FLOPS = 4, 1, 6    # ASSUMPTION: max/sub/sum/scale; one multiply; merge
FLASH_SOFTMAX_FLOPS = 4                   # ASSUMPTION: scale, running max, subtract, row sum
FLASH_BWD_FLOPS = 4                       # ASSUMPTION: dS = P (dP - D) and its scaling


class AttnShape(NamedTuple):
    """One rank's attention problem: `heads` independent (batch x head) problems."""

    heads: int
    seq: int                 # query rows
    keys: int                # key columns each query row sees (seq when dense)
    head_dim: int
    e: int                   # bytes per element of the emulated dtype
    dropout: bool = False
    causal: bool = False
    local_block: int = 0     # > 0: block-sparse local attention in blocks of this size
    training: bool = False   # forward keeps what backward needs (flash: the row LSE)
    triangle: bool = False   # causal rows through Megatron's fused kernel: it loads only
                             # the unmasked lower triangle (`kernels.softmax`, `loaded`)
    v_dim: int = 0           # a value head's width where it differs from q and k's (MLA)

    @property
    def dv(self) -> int:
        """A value (and output) head's width: v_dim, or head_dim."""
        return self.v_dim or self.head_dim

    @property
    def scores(self) -> int:
        return self.heads * self.seq * self.keys

    @property
    def loaded(self) -> float:
        """Share of the scores a fused softmax loads: row r of a causal triangle holds r + 1
        of the `keys` columns, (keys + 1) / (2 keys) of them on average."""
        return (self.keys + 1) / (2 * self.keys) if self.triangle and self.causal else 1.0

    @property
    def groups(self) -> tuple[int, int]:
        """(batch, rows) of the score GEMMs: per head, or per query block when local."""
        if self.local_block:
            return self.heads * math.ceil(self.seq / self.local_block), self.local_block
        return self.heads, self.seq


class GemmStep(NamedTuple):
    name: str
    m: int
    n: int
    k: int
    batch: int
    epilogue: Epilogue = NO_EPILOGUE


class KernelStep(NamedTuple):
    name: str
    kernel: K.Kernel


class FlashStep(NamedTuple):
    name: str
    shape: AttnShape
    backward: bool


Step = Union[GemmStep, KernelStep, FlashStep]


def check_variant(variant: str) -> str:
    if variant not in VARIANTS:
        raise ValueError(f"model.attention={variant!r}; choose one of {list(VARIANTS)}")
    return variant


def sub_vector(cost: DeviceCost, a: AttnShape, dtype: str) -> int:
    """T: the output tile width of the QK^T GEMM (seed 004 2.4: T = that MatMul's tile)."""
    batch, rows = a.groups
    tile = getattr(cost.gemm(rows, a.keys, a.head_dim, dtype=dtype, batch=batch), "tile_n", 0)
    return max(1, min(tile or a.keys, a.keys))


def _stats(a: AttnShape, t: int) -> float:
    """Elements of one statistic (m', d' or r'): one per sub-vector of T scores."""
    return a.heads * a.seq * math.ceil(a.keys / t)


def steps(cost: DeviceCost, a: AttnShape, variant: str, mode: str, dtype: str,
          backward: bool = False) -> list[Step]:
    """The kernels one attention pass launches, in order."""
    if check_variant(variant) == "flash":
        return [FlashStep("flash.bwd" if backward else "flash", a, backward)]
    batch, rows = a.groups
    if backward:
        return [GemmStep("dprobs", rows, a.keys, a.dv, batch),
                GemmStep("dv", a.keys, a.dv, rows, batch),
                *[KernelStep(k.tag, k) for k in K.softmax(a.scores, a.e, mode, a.dropout,
                                                          a.causal, backward=True,
                                                          loaded=a.loaded)],
                GemmStep("dq", rows, a.head_dim, a.keys, batch),
                GemmStep("dk", a.keys, a.head_dim, rows, batch)]
    score = GemmStep("score", rows, a.keys, a.head_dim, batch)
    context = GemmStep("context", rows, a.dv, a.keys, batch)
    drop = [KernelStep(k.tag, k) for k in K.softmax(a.scores, a.e, mode, a.dropout, a.causal)
            if k.tag == "dropout"]
    if variant == "baseline":
        fill = a.keys / a.seq if a.local_block else 1.0
        return [score, *[KernelStep(k.tag, k) for k in K.softmax(
            a.scores, a.e, mode, a.dropout, a.causal, row_fill=fill, loaded=a.loaded)],
                context]
    t = sub_vector(cost, a, dtype)
    st = _stats(a, t) * K.STAT_BYTES
    ir = KernelStep("ir", K.Kernel(IR_FLOPS * _stats(a, t), 2 * st, st, "ir", _stats(a, t)))
    s = a.scores * a.e
    if variant == "sd":
        ls = K.Kernel(LS_FLOPS * a.scores, s, s + 2 * st, "ls", a.scores)
        gs = K.Kernel(GS_FLOPS * a.scores, s + st, s, "gs")
        return [score, KernelStep("ls", ls), ir, KernelStep("gs", gs), *drop, context]
    ls_epi = Epilogue(out_flops=LS_FLOPS, out_sfu=1.0, extra_write_bytes=2 * st)
    gs_pro = Epilogue(a_flops=GS_FLOPS, extra_read_bytes=st)
    return [GemmStep("score+ls", rows, a.keys, a.head_dim, batch, ls_epi), ir, *drop,
            GemmStep("gs+context", rows, a.dv, a.keys, batch, gs_pro)]


class FlashCost(NamedTuple):
    time_s: float
    flops: float
    dram_bytes: float


def flash_cost(spec: DeviceSpec, a: AttnShape, dtype: str, backward: bool = False
               ) -> FlashCost:
    """FlashAttention-2 forward or backward as one kernel (Dao 2023, Alg. 1 and 2).

    CTAs own a query block (forward) or a key block (backward) and stream the other side
    through shared memory; K and V (Q and dO) re-reads are served by L2, so DRAM sees each
    input once and each output once, plus the fp32 LSE (forward, training) and, backward,
    the row sums D = rowsum(dO * O) and the fp32 dQ accumulator (read and written once in
    DRAM). Per block pair (query block x key block) the tensor-core GEMMs (4 d flops per
    score forward, 10 d backward) run at the rate of the instruction FA2 issues, mma.sync
    (`kernels.mma_sync_efficiency` of the dense peak where a preset measures it: Hopper's wgmma,
    which cuBLAS uses, is faster; elsewhere mma.sync is what cuBLAS runs too, at
    `gemm.efficiency`), and the softmax work (exp on the SFUs, the rest on the CUDA cores)
    runs between them, not overlapped (FA2 on one warp group).

    Causal attention skips the key blocks above the diagonal, so a head's CTAs differ in
    work; they are dispatched in launch order (the block index fastest, FA2's grid) onto
    the SMs as these free up (`_makespan`). When CTAs barely outnumber SMs the heavy
    blocks decide the time. Backward, each block pair also adds its dQ partial (query block
    x d, fp32) into the accumulator with atomics through L2, in turn with its math, at the
    SM's share of the preset's L2 atomic rate (`kernels.l2_atomic`, where measured: the
    accumulators of the heads in flight fit in L2). NOT modelled: the backward's
    shared-memory round trips of dS and P.
    """
    kb = spec.kernels
    frac = 0.5 if a.causal and not a.local_block else 1.0
    pairs = a.heads * a.seq * a.keys * frac                     # scores computed
    # flops per score: forward QK^T and PV (2 d + 2 dv); backward QK^T again, dP = dO V^T,
    # dV, dQ and dK (6 d + 4 dv); 4 d and 10 d when dv = d
    width = (6.0 * a.head_dim + 4.0 * a.dv) if backward else (2.0 * a.head_dim + 2.0 * a.dv)
    mma = pairs * width
    cus = spec.compute_units
    sm_math = spec.peak(dtype) * (kb.mma_sync_efficiency or spec.gemm.efficiency) / cus
    sm_vec, sm_sfu = spec.vector_flops_per_s / cus, spec.sfu_ops_per_s / cus
    ops = FLASH_SOFTMAX_FLOPS + (FLASH_BWD_FLOPS if backward else 0)
    per_score = width / sm_math + 1 / sm_sfu + ops / sm_vec
    bq, bk = (kb.flash_bwd_block_q, kb.flash_bwd_block_k) if backward else \
        (kb.flash_block_q, kb.flash_block_k)
    pair_s = bq * bk * per_score
    if backward and kb.l2_atomic_bytes_per_s:       # the pair's dQ partial, added in fp32
        pair_s += bq * a.head_dim * K.STAT_BYTES / (kb.l2_atomic_bytes_per_s / cus)
    compute = _makespan(_block_pairs(a, bq, bk, backward), a.heads, cus) * pair_s
    io = a.heads * a.seq * a.head_dim * a.e                      # one of Q, K
    io_v = a.heads * a.seq * a.dv * a.e                         # one of V, O, dO
    lse = a.heads * a.seq * K.STAT_BYTES
    if backward:
        dq_acc = a.heads * a.seq * a.head_dim * K.STAT_BYTES
        dram = (2 * io + 3 * io_v) + 2 * lse + (2 * io + io_v) + 2 * dq_acc
    else:
        dram = 2 * io + 2 * io_v + (lse if a.training else 0)
    memory = dram / spec.dram_stream_bw
    return FlashCost(spec.kernel_launch_s + max(compute, memory), mma, dram)


def _block_pairs(a: AttnShape, bq: int, bk: int, backward: bool) -> tuple[int, ...]:
    """Block pairs each CTA of one head computes, in launch order. Forward: query block m
    sees key blocks up to the diagonal (causal) or all; backward: key block n sees the
    query blocks from the diagonal down (causal) or all."""
    nq, nk = math.ceil(a.seq / bq), math.ceil(a.keys / bk)
    causal = a.causal and not a.local_block
    if backward:
        return tuple(nq - (n * bk) // bq if causal else nq for n in range(nk))
    return tuple(min(nk, math.ceil((m + 1) * bq / bk)) if causal else nk for m in range(nq))


@functools.lru_cache(maxsize=256)
def _makespan(per_head: tuple[int, ...], heads: int, cus: int) -> int:
    """Block pairs on the busiest SM when `heads` copies of `per_head` are dispatched in
    order, each CTA to the SM that frees first (list scheduling; ties to the lowest SM)."""
    free = [(0, sm) for sm in range(cus)]
    for _ in range(heads):
        for work in per_head:
            t, sm = heapq.heappop(free)
            heapq.heappush(free, (t + work, sm))
    return max(t for t, _ in free)


def step_cost(cost: DeviceCost, step: Step, dtype: str) -> tuple[float, float, float]:
    """(time, flops, DRAM bytes) of one step on its own."""
    if isinstance(step, GemmStep):
        g = cost.gemm(step.m, step.n, step.k, dtype=dtype, batch=step.batch,
                       epilogue=step.epilogue)
        return g.time_s, g.flops, g.dram_bytes
    if isinstance(step, KernelStep):
        k = step.kernel
        return (cost.elementwise_s(k.read_bytes, k.write_bytes, k.flops, sfu_ops=k.sfu_ops,
                                    bw_util=k.bw_util), k.flops, k.dram_bytes)
    f = flash_cost(cost.spec, step.shape, dtype, step.backward)
    return f.time_s, f.flops, f.dram_bytes

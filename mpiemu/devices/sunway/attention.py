"""SWattention cost on one CG: the block loops of SWA Algorithms 2 and 3 replayed in time.

The 64 CPEs of a CG run the same block program in lockstep (SWA 3.1: all CPEs load the same
K_j, V_j in iteration j), so one CPE's compute stream and the CG's DMA engine (a FIFO that
serves the 64 CPEs' requests) describe the CG. Asynchronous DMA (SWA 3.2, Fig. 5) lets a load
run while the CPE computes; the CPE waits only where the data is needed. Heads are spread over
the CGs (SWA 3.1), so a processor takes ceil(B*N / 6) head times.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..specs import dtype_bytes
from .blocks import Blocks
from .spec import SunwaySpec

STAT_BYTES = 4      # l and m stay FP32, kept side by side in DRAM so one request moves both

# Non-GEMM LDM work per score element, counted from SWA Algorithms 2/3 as described in 3.2-3.3:
# forward: scale, mask (index compare + select), row max, subtract, row sum, dropout compare
# and rescale; backward: scale, mask (2), subtract m, divide by l, dropout compare and
# rescale, transpose P, dropout on dP, dS = P (dP - D) (2), transpose dS.
FWD_VEC_OPS, BWD_VEC_OPS = 8, 12
MASK_OPS, DROPOUT_FWD_OPS, DROPOUT_BWD_OPS = 2, 2, 3
FWD_CONVERTS, BWD_CONVERTS = 2, 4   # FP16 GEMM results to FP32 for exp and back (SWA 3.3)


@dataclass(frozen=True)
class HeadCost:
    """One [S, H] head on one CG: its emulated time and what its engines did."""

    time_s: float
    dma_busy_s: float
    cpe_busy_s: float
    rma_s: float
    dram_read_bytes: float
    dram_write_bytes: float
    blocks: Blocks
    active_cpe_frac: float          # mean fraction of the 64 CPEs with a Q block


class _Lockstep:
    """A CPE compute clock and the CG's DMA engine clock (FIFO)."""

    def __init__(self, sw: SunwaySpec, async_dma: bool) -> None:
        self.sw = sw
        self.async_dma = async_dma
        self.cpe = 0.0
        self.engine = 0.0
        self.dma_busy = 0.0
        self.cpe_busy = 0.0
        self.read = 0.0
        self.write = 0.0

    def dma(self, nbytes: float, requests: float, store: bool = False) -> float:
        """Queue a transfer issued now; returns when it completes (blocking DMA waits)."""
        dur = self.sw.dma_s(nbytes, requests, store)
        start = max(self.cpe, self.engine)
        self.engine = start + dur
        self.dma_busy += dur
        if store:
            self.write += nbytes
        else:
            self.read += nbytes
        if not self.async_dma:
            self.cpe = self.engine
        return self.engine

    def wait(self, t: float) -> None:
        self.cpe = max(self.cpe, t)

    def compute(self, seconds: float) -> None:
        self.cpe += seconds
        self.cpe_busy += seconds

    @property
    def end(self) -> float:
        return max(self.cpe, self.engine)


def _elem_cycles(sw: SunwaySpec, pass_: str, dtype: str, causal: bool, dropout: bool) -> float:
    """CPE cycles of non-GEMM work per score element of a block."""
    fwd = pass_ == "fwd"
    ops = FWD_VEC_OPS if fwd else BWD_VEC_OPS
    if not causal:
        ops -= MASK_OPS
    cycles = sw.exp_cycles
    if dropout:
        cycles += sw.rng_cycles
    else:
        ops -= DROPOUT_FWD_OPS if fwd else DROPOUT_BWD_OPS
    cycles += ops * sw.vec_op_cycles
    if dtype == "fp16":
        cycles += (FWD_CONVERTS if fwd else BWD_CONVERTS) * sw.convert_cycles
    return cycles


def _loops(sw: SunwaySpec, s: int, b: Blocks) -> tuple[int, list[int]]:
    """Outer K/V blocks and the active CPE count of each inner iteration (SWA 3.1)."""
    p = sw.cpes_per_cg
    tr = math.ceil(s / b.br)
    inner = [min(p, tr - it * p) for it in range(math.ceil(tr / p))]
    return math.ceil(s / b.bc), inner


def swattention_fwd_head(sw: SunwaySpec, s: int, h: int, dtype: str, b: Blocks, *,
                         causal: bool = True, dropout: bool = True,
                         async_dma: bool = True) -> HeadCost:
    """Forward of one head on one CG (SWA Algorithm 2: K/V outer loop, Q inner loop)."""
    e = dtype_bytes(dtype)
    tc, inner = _loops(sw, s, b)
    gemm = 2.0 * b.br * b.bc * h / sw.cpe_gemm_rate(dtype)
    elem = sw.cycles_s(b.br * b.bc * _elem_cycles(sw, "fwd", dtype, causal, dropout))
    rescale = sw.cycles_s(2 * b.br * h * sw.vec_op_cycles)
    kv = sw.kv_dma_copies
    p = _Lockstep(sw, async_dma)
    for _ in range(tc):
        p.wait(p.dma(2 * b.bc * h * e * kv, 2 * kv))                  # K_j, V_j to every CPE
        p.compute(sw.cycles_s(b.bc * h * sw.vec_op_cycles))           # transpose K_j in LDM
        for a in inner:
            q = p.dma(a * b.br * (h * e + 2 * STAT_BYTES), 2 * a)     # Q_i and (l_i, m_i)
            o = p.dma(a * b.br * h * e, a)                            # O_i, behind line 11
            p.wait(q)
            p.compute(gemm)                                           # line 11: tau Q_i K_j^T
            p.compute(elem)                                           # mask, softmax, dropout
            p.compute(gemm)                                           # P_ij V_j
            p.wait(o)
            p.compute(rescale)                                        # O_i update
            p.dma(a * b.br * (h * e + 2 * STAT_BYTES), 2 * a, store=True)
    active = sum(inner) / (len(inner) * sw.cpes_per_cg)
    return HeadCost(p.end, p.dma_busy, p.cpe_busy, 0.0, p.read, p.write, b, active)


def rma_tree_s(sw: SunwaySpec, nbytes: float, elems: int) -> float:
    """Tree reduction of a per-CPE array over RMA: log2(64) rounds (SWA 3.2, Fig. 4).

    Round i: CPE k < 2^(5-i) gets CPE k + 2^(5-i)'s array through its RMA port (the pairs
    share the CG's network) and adds it with SIMD; each round ends in a CG-wide sync.
    """
    rounds = int(math.log2(sw.cpes_per_cg))
    add = sw.cycles_s(elems * sw.simd_stream_cycles)
    total = 0.0
    for i in range(rounds):
        pairs = 2 ** (rounds - 1 - i)
        total += sw.rma_latency_s + max(nbytes / sw.rma_port, pairs * nbytes / sw.rma_cg) + add
    return total


def swattention_bwd_head(sw: SunwaySpec, s: int, h: int, dtype: str, b: Blocks, *,
                         causal: bool = True, dropout: bool = True,
                         async_dma: bool = True) -> HeadCost:
    """Backward of one head on one CG (SWA Algorithm 3 with the RMA tree of dK, dV)."""
    e = dtype_bytes(dtype)
    tc, inner = _loops(sw, s, b)
    gemm = 2.0 * b.br * b.bc * h / sw.cpe_gemm_rate(dtype)
    cyc = _elem_cycles(sw, "bwd", dtype, causal, dropout)
    vec = sw.vec_op_cycles
    line12 = sw.cycles_s(b.br * b.bc * (cyc - 5 * vec))     # recompute P_ij and its dropout
    one_pass = sw.cycles_s(b.br * b.bc * vec)
    d_row = sw.cycles_s(2 * b.br * h * vec)                 # D_i = rowsum(dO_i * O_i)
    kv = sw.kv_dma_copies
    tree = rma_tree_s(sw, 2 * b.bc * h * e, 2 * b.bc * h)
    p = _Lockstep(sw, async_dma)
    rma = 0.0
    for _ in range(tc):
        p.wait(p.dma(2 * b.bc * h * e * kv, 2 * kv))
        p.compute(sw.cycles_s(2 * b.bc * h * vec))          # transpose K_j and V_j
        for a in inner:
            blk = a * b.br * h * e
            q = p.dma(blk + a * b.br * 2 * STAT_BYTES, 2 * a)   # Q_i and (l_i, m_i)
            do, o, dq = (p.dma(blk, a) for _ in range(3))       # async in use order (SWA 3.2)
            p.wait(q)
            p.compute(gemm + line12)                            # line 12: S_ij, P_ij, dropout
            p.wait(do)
            p.compute(one_pass + gemm)                          # line 17: dV~ += P^T dO_i
            p.compute(one_pass + gemm)                          # line 18: dP = dO_i V_j^T
            p.wait(o)
            p.compute(d_row + 2 * one_pass)                     # lines 20-21: D_i, dS
            p.wait(dq)
            p.compute(gemm)                                     # line 22: dQ_i += tau dS K_j
            p.dma(blk, a, store=True)                           # dQ_i store overlaps line 23
            p.compute(one_pass + gemm)                          # line 23: dK~ += tau dS^T Q_i
        p.compute(tree)                                         # RMA tree over 64 CPEs
        rma += tree
        p.dma(2 * b.bc * h * e, 2, store=True)                  # CPE 0 stores dK_j, dV_j
    active = sum(inner) / (len(inner) * sw.cpes_per_cg)
    return HeadCost(p.end, p.dma_busy, p.cpe_busy, rma, p.read, p.write, b, active)

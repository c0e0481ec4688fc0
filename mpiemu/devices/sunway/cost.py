"""SunwayCost: the DeviceCost of a SW26010pro rank, plus attention costs for the layers.

GEMMs are SwFormer's pad-free tilings in waves over the CGs (`gemm.py`); memory-bound kernels
stream through every CG's DMA engine; attention is SWattention (per-CG block loops,
`attention.py`) or the standard operator chain (`standard.py`) with its memory check.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

from ..gemm import NO_EPILOGUE, Epilogue
from ..specs import DeviceSpec, dtype_bytes
from .attention import HeadCost, swattention_bwd_head, swattention_fwd_head
from .blocks import Blocks, paper_blocks, search_blocks
from .gemm import REQUEST_BYTES, SunwayGemmCost, best_gemm
from .schedule import Op, Schedule, schedule
from .spec import SunwaySpec
from .standard import (Kernel, standard_bwd_kernels, standard_footprint_bytes,
                       standard_fwd_kernels)

KERNELS = ("swattention", "standard")
BLOCK_POLICIES = ("paper", "search")


class SunwayOutOfMemory(ValueError):
    """An operator's live tensors exceed the rank's DRAM (SWA 4.2: standard attention OOM)."""


@dataclass(frozen=True)
class AttnShape:
    """Attention on one rank: B x N heads of [S, H] (N = heads on this processor)."""

    batch: int
    heads: int
    seq: int
    head_dim: int
    dtype: str = "fp32"
    causal: bool = True
    dropout: bool = True

    def __post_init__(self) -> None:
        for name in ("batch", "heads", "seq", "head_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"attention {name}={getattr(self, name)} must be >= 1")
        dtype_bytes(self.dtype)

    def flops(self, pass_: str) -> float:
        """SWA Eq. 4: 4BNS^2H forward, twice that backward (recompute not counted)."""
        f = 4.0 * self.batch * self.heads * self.seq ** 2 * self.head_dim
        return f if pass_ == "fwd" else 2.0 * f


@dataclass(frozen=True)
class AttentionCost:
    """One attention pass on one rank."""

    kernel: str
    pass_: str
    shape: AttnShape
    time_s: float
    dram_bytes: float
    footprint_bytes: float
    head: HeadCost | None = None                    # SWattention: one head on one CG
    tasks: tuple[float, ...] = ()                   # SWattention: one task per head (one CG)
    kernels: tuple[Kernel, ...] = field(default=())  # standard: its operators in order

    @property
    def flops(self) -> float:
        return self.shape.flops(self.pass_)

    @property
    def tflops(self) -> float:
        return self.flops / self.time_s / 1e12


class SunwayCost:
    """Costs of one Sunway rank (all-shared processor or single CG), behind DeviceCost."""

    def __init__(self, spec: DeviceSpec, sunway: SunwaySpec | None = None, *,
                 tile_fusion: bool = False) -> None:
        self.spec = spec
        self.sw = sunway if sunway is not None else SunwaySpec.for_device(spec)
        self.tile_fusion = tile_fusion
        self._gemm = lru_cache(maxsize=4096)(self._gemm_uncached)
        self._head = lru_cache(maxsize=4096)(self._head_uncached)

    # --- DeviceCost ---------------------------------------------------------------------------
    def gemm(self, m: int, n: int, k: int, *, dtype: str = "fp16", batch: int = 1,
             bypass_llc_output: bool = False, compute_units: int | None = None,
             layout: str = "NN", epilogue: Epilogue = NO_EPILOGUE) -> SunwayGemmCost:
        """Best pad-free tiling; stages are waves over the CGs (`compute_units` of them; no
        LLC on the CPE path, so `bypass_llc_output` changes nothing; the layout does not
        change a CPE tiling). Fused GPU epilogues are not a Sunway kernel."""
        if epilogue != NO_EPILOGUE:
            raise ValueError("fused GEMM epilogues are a GPU (cuBLASLt) feature; not modelled "
                             "on Sunway")
        return self._gemm(m, n, k, dtype, batch, compute_units)

    def _gemm_uncached(self, m: int, n: int, k: int, dtype: str, batch: int,
                       cgs: int | None) -> SunwayGemmCost:
        return best_gemm(self.sw, m, n, k, dtype, batch, fusion=self.tile_fusion, cgs=cgs)

    def elementwise_s(self, read_bytes: float, write_bytes: float, flops: float = 0.0,
                      *, launch: bool = True, sfu_ops: float = 0.0,
                      bw_util: float = 1.0) -> float:
        """DMA in and out through every CG's engine vs SIMD work on every CPE, overlapped
        (`sfu_ops` and `bw_util`, GPU notions, are ignored: CPE costs are in the Sunway
        kernels)."""
        sw, cgs = self.sw, self.sw.core_groups
        dma = (sw.dma_s(read_bytes / cgs, read_bytes / cgs / REQUEST_BYTES)
               + sw.dma_s(write_bytes / cgs, write_bytes / cgs / REQUEST_BYTES, store=True))
        body = max(dma, flops / self.spec.vector_flops_per_s)
        return body + (self.spec.kernel_launch_s if launch else 0.0)

    def reduction_s(self, n_elems: int, elem_bytes: float) -> float:
        """A ring step's reduction: read two copies, write the sum (no launch)."""
        return self.elementwise_s(2.0 * n_elems * elem_bytes, 1.0 * n_elems * elem_bytes,
                                  float(n_elems), launch=False)

    # --- attention ------------------------------------------------------------------------------
    def blocks(self, pass_: str, shape: AttnShape, policy: str = "paper") -> Blocks:
        """Br, Bc for a pass: SWA 4.2's choices, or the fitting pair of least modelled time."""
        if policy == "paper":
            return paper_blocks(pass_, shape.dtype, shape.head_dim, shape.seq)
        if policy == "search":
            head = swattention_fwd_head if pass_ == "fwd" else swattention_bwd_head
            return search_blocks(pass_, shape.dtype, shape.head_dim, shape.seq,
                                 self.sw.ldm_usable_bytes,
                                 lambda b: head(self.sw, shape.seq, shape.head_dim,
                                                shape.dtype, b).time_s)
        raise ValueError(f"blocks={policy!r}; choose one of {list(BLOCK_POLICIES)}")

    def _head_uncached(self, pass_: str, s: int, h: int, dtype: str, b: Blocks, causal: bool,
                       dropout: bool, async_dma: bool) -> HeadCost:
        fn = swattention_fwd_head if pass_ == "fwd" else swattention_bwd_head
        return fn(self.sw, s, h, dtype, b, causal=causal, dropout=dropout, async_dma=async_dma)

    def attention(self, pass_: str, shape: AttnShape, *, kernel: str = "swattention",
                  blocks: str | Blocks = "paper", async_dma: bool = True,
                  check_memory: bool = True, training: bool = True) -> AttentionCost:
        """One attention pass on this rank; raises SunwayOutOfMemory when it cannot fit."""
        if pass_ not in ("fwd", "bwd"):
            raise ValueError(f"pass={pass_!r}; choose 'fwd' or 'bwd'")
        if kernel == "swattention":
            cost = self._swattention(pass_, shape, blocks, async_dma)
        elif kernel == "standard":
            cost = self._standard(pass_, shape, training)
        else:
            raise ValueError(f"attention kernel={kernel!r}; choose one of {list(KERNELS)}")
        if check_memory and cost.footprint_bytes > self.sw.dram_capacity_bytes:
            raise SunwayOutOfMemory(
                f"{kernel} attention {pass_} needs {cost.footprint_bytes / 1e9:.1f} GB > "
                f"{self.sw.dram_capacity_bytes / 1e9:.0f} GB DRAM at B={shape.batch} "
                f"N={shape.heads} S={shape.seq} H={shape.head_dim} {shape.dtype}")
        return cost

    def attention_fwd(self, shape: AttnShape, **kw: object) -> AttentionCost:
        return self.attention("fwd", shape, **kw)  # type: ignore[arg-type]

    def attention_bwd(self, shape: AttnShape, **kw: object) -> AttentionCost:
        return self.attention("bwd", shape, **kw)  # type: ignore[arg-type]

    def _swattention(self, pass_: str, shape: AttnShape, blocks: str | Blocks,
                     async_dma: bool) -> AttentionCost:
        """Heads spread over the CGs, each a whole [S, H] problem for one CG (SWA 3.1)."""
        b = blocks if isinstance(blocks, Blocks) else self.blocks(pass_, shape, blocks)
        head = self._head(pass_, shape.seq, shape.head_dim, shape.dtype, b, shape.causal,
                          shape.dropout, async_dma)
        n = shape.batch * shape.heads
        rounds = math.ceil(n / self.sw.core_groups)
        e = dtype_bytes(shape.dtype)
        io = float(n) * shape.seq * shape.head_dim * e
        stats = 2.0 * n * shape.seq * 4
        footprint = (4 if pass_ == "fwd" else 8) * io + stats
        time = self.spec.kernel_launch_s + rounds * head.time_s
        dram = n * (head.dram_read_bytes + head.dram_write_bytes)
        return AttentionCost("swattention", pass_, shape, time, dram, footprint, head=head,
                             tasks=(head.time_s,) * n)

    def _standard(self, pass_: str, shape: AttnShape, training: bool) -> AttentionCost:
        args = (self.sw, shape.batch, shape.heads, shape.seq, shape.head_dim, shape.dtype,
                shape.causal, shape.dropout)
        ks = standard_fwd_kernels(*args) if pass_ == "fwd" else standard_bwd_kernels(*args)
        footprint = standard_footprint_bytes(shape.batch, shape.heads, shape.seq,
                                             shape.head_dim, shape.dtype, training=training,
                                             causal=shape.causal, dropout=shape.dropout)
        return AttentionCost("standard", pass_, shape, sum(k.time_s for k in ks),
                             sum(k.read_bytes + k.write_bytes for k in ks), footprint,
                             kernels=tuple(ks))

    def per_cg_busy_s(self, cost: AttentionCost) -> list[float]:
        """Busy time of each CG for SWattention's round-robin head placement (SWA 3.1)."""
        busy = [0.0] * self.sw.core_groups
        for i, t in enumerate(cost.tasks):
            busy[i % self.sw.core_groups] += t
        return busy

    def schedule(self, ops: list[Op], policy: str = "intra") -> Schedule:
        """SwFormer's CG task queue over a layer's ops (`intra`, `opt2` or `ka`)."""
        return schedule(ops, self.sw.core_groups, policy)

"""Hardware descriptions: frozen dataclasses with SI units in every field name.

Presets (TOML data files beside this module) are turned into these specs by
`mpiemu.devices.presets`; every number there carries its source. Every number a model reads is a
field here (or of `contention.T3Params`), so `mpiemu.devices.caps` can load, override, scale and
show it generically (`--set device.<field>=...`, `mpiemu devices NAME`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Mapping

from .caps import Scale, cap, scaled
from .contention import T3Params

DTYPE_BYTES: dict[str, int] = {"fp8": 1, "fp16": 2, "bf16": 2, "tf32": 4, "fp32": 4,
                               "fp64": 8}
MATRIX_DTYPES = ("fp8", "fp16", "bf16", "tf32")     # run on tensor cores / matrix cores
DEVICE_KINDS = ("gpu", "sunway")


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of an emulated dtype name."""
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(f"dtype={dtype!r} is not an emulated dtype; choose one of "
                         f"{sorted(DTYPE_BYTES)}") from None


@dataclass(frozen=True)
class GemmTiling:
    """How the GPU BLAS tiles a GEMM into CTAs (workgroups) and what a tile sustains.

    Candidate CTA tiles are the powers of two between `tile_min` and the largest side of
    `tile_m x tile_n`, no larger in area than it, with aspect ratio <= 2 (the cuBLAS tile set,
    NVIDIA Matrix Multiplication guide 2.3); `devices.gemm` picks the fastest, with split-K up to
    `split_k_max`. Absent keys of an older preset default to its single `tile_m x tile_n` tile.
    """

    tile_m: int                     # largest CTA tile (rows x columns of C)
    tile_n: int
    wgs_per_cu: int                 # CTAs of the largest tile a CU holds at once
    efficiency: float               # matrix-unit fraction of peak a steady K-loop sustains
    tile_min: int = 0               # smallest tile side (0: tile_m x tile_n only)
    simt_efficiency: float = 0.0    # the same for fp32 / fp64 on CUDA cores (0: `efficiency`)
    unthrottled_efficiency: float = 0.0  # per clock with the power limit not binding (0: as above)
    wave_fixed_s: float = field(default=0.0, metadata=cap(scale="compute", inverse=True))
    l2_bw_bytes_per_s: float = field(default=math.inf, metadata=cap(scale="compute"))
    smem_per_cu_bytes: float = math.inf     # shared memory per CU (limits CTAs per CU)
    pipeline_stages: int = 3        # K-blocks in flight per CTA (multistage mainloop)
    k_block_bytes: int = 64         # bytes of K per mainloop step (32 fp16, 16 tf32)
    split_k_max: int = 1
    swizzle: int = 1                # 1: squarish raster bands (CUTLASS swizzle), 0: row-major
    bypass_llc_output: bool = False  # T3 uncached outputs are decided per run, not here
    # wave_fixed_s: per-wave pipeline fill + epilogue drain; l2_bw: L2 -> SM operand feed

    def __post_init__(self) -> None:
        if min(self.tile_m, self.tile_n, self.wgs_per_cu, self.pipeline_stages,
               self.k_block_bytes, self.split_k_max) < 1:
            raise ValueError(f"gemm tiling {self} needs positive tile sizes and counts")
        if not 0 < self.efficiency <= 1 or not 0 <= self.simt_efficiency <= 1:
            raise ValueError(f"gemm efficiency={self.efficiency} must be in (0, 1]")
        if not 0 <= self.unthrottled_efficiency <= 1:
            raise ValueError(f"gemm unthrottled_efficiency={self.unthrottled_efficiency} "
                             "must be in [0, 1] (0: as efficiency)")

    @property
    def largest_side(self) -> int:
        return max(self.tile_m, self.tile_n)


@dataclass(frozen=True)
class KernelSpec:
    """Non-GEMM kernel rates of a GPU (preset [kernels]; defaults for presets without it).

    `sfu_per_clock_per_cu`: special-function results (exp2, rcp) per clock per SM, CUDA C
    Programming Guide "Arithmetic Instructions" (16 for compute capability 5.x-9.0).
    `flash_block_q`, `flash_block_k`: FlashAttention-2's query / key block sizes.
    `flash_bwd_block_q`, `flash_bwd_block_k`: its backward's blocks (a CTA per key block,
    walking the query blocks).
    `mma_sync_efficiency`: the rate of the Ampere-style mma.sync instruction FlashAttention-2
    issues, over the dense tensor peak, where it differs from the GEMMs' (Hopper, whose
    cuBLAS uses wgmma); 0: as `gemm.efficiency`.
    `l2_atomic_bytes_per_s`: fp32 atomic adds into an L2-resident buffer (FA2's backward
    accumulates dQ so); 0: not charged.
    """

    sfu_per_clock_per_cu: float = 16.0
    flash_block_q: int = 128
    flash_block_k: int = 64
    flash_bwd_block_q: int = 64
    flash_bwd_block_k: int = 128
    mma_sync_efficiency: float = 0.0
    l2_atomic_bytes_per_s: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.mma_sync_efficiency <= 1:
            raise ValueError(f"kernels.mma_sync_efficiency={self.mma_sync_efficiency} must be "
                             "in [0, 1]")
        if self.l2_atomic_bytes_per_s < 0:
            raise ValueError(f"kernels.l2_atomic={self.l2_atomic_bytes_per_s} must be >= 0")


@dataclass(frozen=True)
class NmcSpec:
    """Near-bank compute in the DRAM stacks (thesis 6.2.2): an ALU at every bank, commands
    broadcast to all channels so every bank runs each one on its own data (all-bank mode).

    An NMC instruction streams one array through the ALU a temporary-storage (TS) chunk at a
    time: activate the row, `ts / column` column accesses `t_ccd_s` apart, precharge; a
    write also waits for the write latency and recovery (JEDEC row cycle, thesis 6.4: larger
    TS means fewer activations). Cross-bank reductions go through the GPU (`host_sync_s`).
    """

    banks: int                      # banks with an ALU over all stacks
    column_bytes: float             # bank output width per column access (thesis 6.2.2: 256 b)
    row_bytes: float                # one bank's row (page): a chunk never spans two rows
    ts_bytes: float                 # ALU temporary storage per bank
    t_ccd_s: float                  # column to column, same bank group (tCCD_L)
    t_rcd_s: float                  # activate to column command
    t_rp_s: float                   # precharge
    t_ras_s: float                  # activate to precharge, minimum
    t_rtp_s: float                  # read to precharge
    t_wl_s: float                   # write command to the end of its data (CWL + burst)
    t_wr_s: float                   # write recovery before precharge
    host_sync_s: float              # GPU reads per-bank partial sums, returns the result

    def __post_init__(self) -> None:
        for f in fields(self):
            if not getattr(self, f.name) > 0:
                raise ValueError(f"nmc.{f.name}={getattr(self, f.name)} must be > 0")
        if self.ts_bytes < self.column_bytes:
            raise ValueError(f"nmc.ts_bytes={self.ts_bytes} holds less than one column "
                             f"({self.column_bytes} bytes)")


SUNWAY_MAY_BE_ZERO = ("dma_request_overhead_s", "rma_latency_s")


@dataclass(frozen=True)
class SunwayParams:
    """The Sunway-only numbers of a preset's `[sunway]` section (SWA 2.3), for the device the
    rank plays (a processor in all-shared mode, one CG in single-CG mode); per-CG and
    per-CPE rates are derived by `devices.sunway.SunwaySpec`."""

    core_groups: int
    cpes_per_cg: int
    cpe_mesh: int
    simd_bits: int
    ldm_bytes: float
    ldm_usable_bytes: float
    dram_per_cg_bytes: float
    dma_theoretical_bytes_per_s: float = field(metadata=cap(scale="memory_bw"))
    dma_load_bytes_per_s: float = field(metadata=cap(scale="memory_bw"))
    dma_store_bytes_per_s: float = field(metadata=cap(scale="memory_bw"))
    dma_measured_request_bytes: float
    dma_request_overhead_s: float
    rma_bytes_per_s: float
    rma_latency_s: float
    global_load_bytes_per_s: float   # without DMA (SWA 4.3)
    global_store_bytes_per_s: float
    kv_dma_copies: int
    exp_cycles: float
    rng_cycles: float
    vec_op_cycles: float
    convert_cycles: float
    simd_stream_cycles: float

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, (int, float)):
                continue
            if v < 0 or (v == 0 and f.name not in SUNWAY_MAY_BE_ZERO):
                raise ValueError(f"sunway.{f.name}={v} must be > 0")
        if self.cpe_mesh ** 2 != self.cpes_per_cg:
            raise ValueError(f"sunway.cpe_mesh={self.cpe_mesh}: mesh^2 must equal "
                             f"cpes_per_cg={self.cpes_per_cg}")
        if self.kv_dma_copies not in (1, self.cpes_per_cg):
            raise ValueError(f"sunway.kv_dma_copies={self.kv_dma_copies}: choose 1 (broadcast) "
                             f"or {self.cpes_per_cg} (one private copy per CPE)")
        if self.dma_request_overhead_s * self.dma_load_bytes_per_s / self.core_groups \
                >= self.dma_measured_request_bytes:
            raise ValueError("sunway.dma_request_overhead is longer than a measured request")
        if not self.ldm_usable_bytes <= self.ldm_bytes:
            raise ValueError("sunway.ldm_usable must not exceed sunway.ldm")


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator as a rank plays it: compute, memory hierarchy, launch cost, and the
    optional sections of the models that need them (T3 overlap, near-memory compute, Sunway).
    `scale` records the what-if factors already applied (`caps.scaled`); `sources` maps each
    field path to its source (preset, default, override). `network` names the network
    preset (`mpiemu/net/presets/`) a job of these devices uses unless its workload names
    another."""

    name: str
    kind: str
    peak_flops_per_s: Mapping[str, float] = field(metadata=cap(
        section="compute", key="peak_{}", scale="compute", entries=tuple(DTYPE_BYTES)))
    vector_flops_per_s: float = field(metadata=cap("compute", key="vector_fp32",
                                                   scale="compute"))
    dram_bw_bytes_per_s: float = field(metadata=cap("memory", scale="memory_bw"))
    dram_capacity_bytes: float = field(metadata=cap("memory"))
    llc_bytes: float = field(metadata=cap("memory"))
    compute_units: int = field(metadata=cap("compute"))
    clock_hz: float = field(metadata=cap("compute", scale="compute"))
    kernel_launch_s: float = field(metadata=cap("compute"))
    dram_efficiency: float = field(metadata=cap("memory"))   # streaming kernels' share of peak
    gemm: GemmTiling = field(metadata=cap())
    kernels: KernelSpec = KernelSpec()
    t3: T3Params | None = None      # [t3]: memory-system parameters of the overlap models
    nmc: NmcSpec | None = None      # [nmc]: near-bank compute (optimizer.on = "nmc")
    sunway: SunwayParams | None = None
    base_clock_hz: float = field(default=0.0, metadata=cap("compute"))   # 0: none published
    scale: Scale = field(default=Scale(), metadata=cap(preset=False))
    description: str = ""
    network: str = ""               # the network preset a job of these devices defaults to
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in DEVICE_KINDS:
            raise ValueError(f"device.kind={self.kind!r}; choose one of {list(DEVICE_KINDS)}")
        for key in ("dram_bw_bytes_per_s", "dram_capacity_bytes", "compute_units", "clock_hz",
                    "vector_flops_per_s"):
            if getattr(self, key) <= 0:
                raise ValueError(f"device {self.name}: {key}={getattr(self, key)} must be > 0")
        if not 0 < self.dram_efficiency <= 1:
            raise ValueError(f"device {self.name}: dram_efficiency={self.dram_efficiency} "
                             "must be in (0, 1]")
        if not self.peak_flops_per_s:
            raise ValueError(f"device {self.name}: needs at least one peak_<dtype>_TFLOPS")
        if (self.kind == "sunway") != (self.sunway is not None):
            raise ValueError(f"device {self.name}: a {self.kind} preset "
                             + ("needs a [sunway] section" if self.kind == "sunway"
                                else "has a [sunway] section, which only kind 'sunway' reads"))

    def peak(self, dtype: str) -> float:
        """Matrix-unit peak flop/s for an emulated dtype."""
        try:
            return self.peak_flops_per_s[dtype]
        except KeyError:
            raise ValueError(f"device {self.name} has no peak for dtype={dtype!r}; it has "
                             f"{sorted(self.peak_flops_per_s)}") from None

    def at_base_clock(self) -> "DeviceSpec":
        """This device as a profiler sees it when it locks the SM clock to base, the rated-TDP
        frequency (Nsight Compute's default; CUPTI_CLOCK_CONTROL_MODE_BASE): matrix, vector,
        SFU and L2 rates scale to that clock (the fields `device.scale.compute` scales), the
        memory clock stays, and the matrix units run at `gemm.unthrottled_efficiency`. At
        boost a GEMM on random data draws past the power limit and the board lowers its
        clock, which a measured rate over the boost peak (`gemm.efficiency`) folds in; at
        the TDP clock the limit does not bind, so only the per-clock efficiency is left."""
        if self.base_clock_hz <= 0:
            raise ValueError(f"device {self.name}: base_clock_hz={self.base_clock_hz}; a clock "
                             "lock needs the preset's compute.base_clock_GHz (> 0)")
        spec, _ = scaled(self, compute=self.base_clock_hz / self.clock_hz)
        eff = self.gemm.unthrottled_efficiency or self.gemm.efficiency
        return replace(spec, clock_hz=self.base_clock_hz,  # type: ignore[no-any-return]
                       gemm=replace(spec.gemm, efficiency=eff))

    @property
    def sfu_ops_per_s(self) -> float:
        """Special-function (exp) results per second over the whole device."""
        return self.kernels.sfu_per_clock_per_cu * self.compute_units * self.clock_hz

    @property
    def dram_stream_bw(self) -> float:
        """DRAM bandwidth a streaming kernel actually gets (bytes/s)."""
        return self.dram_bw_bytes_per_s * self.dram_efficiency

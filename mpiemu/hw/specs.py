"""Hardware descriptions: frozen dataclasses with SI units in every field name.

Presets (TOML data files beside this module) are turned into these specs by
`mpiemu.hw.presets`; every number there carries its source.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping

DTYPE_BYTES: dict[str, int] = {"fp16": 2, "bf16": 2, "tf32": 4, "fp32": 4, "fp64": 8}
MATRIX_DTYPES = ("fp16", "bf16", "tf32")     # run on tensor cores / matrix cores
TOPOLOGIES = ("ring", "fully-connected")
DEVICE_KINDS = ("gpu", "sunway")


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of an emulated dtype name."""
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(f"dtype={dtype!r} is not an emulated dtype; choose one of "
                         f"{sorted(DTYPE_BYTES)}") from None


@dataclass(frozen=True)
class LinkSpec:
    """One inter-device link direction model (alpha-beta) and the topology it forms."""

    latency_s: float
    bw_bytes_per_s: float          # per direction
    topology: str = "ring"
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.latency_s < 0:
            raise ValueError(f"link.latency_s={self.latency_s} must be >= 0")
        if self.bw_bytes_per_s <= 0:
            raise ValueError(f"link.bw_bytes_per_s={self.bw_bytes_per_s} must be > 0")
        if self.topology not in TOPOLOGIES:
            raise ValueError(f"link.topology={self.topology!r}; choose one of {list(TOPOLOGIES)}")

    def transfer_s(self, nbytes: float) -> float:
        """alpha + bytes / beta: how long one message occupies the sender's link."""
        return self.latency_s + nbytes / self.bw_bytes_per_s


@dataclass(frozen=True)
class GemmTiling:
    """How the GPU BLAS tiles a GEMM into CTAs (workgroups) and what a tile sustains.

    Candidate CTA tiles are the powers of two between `tile_min` and the largest side of
    `tile_m x tile_n`, no larger in area than it, with aspect ratio <= 2 (the cuBLAS tile set,
    NVIDIA Matrix Multiplication guide 2.3); `hw.gemm` picks the fastest, with split-K up to
    `split_k_max`. Absent keys of an older preset default to its single `tile_m x tile_n` tile.
    """

    tile_m: int                     # largest CTA tile (rows x columns of C)
    tile_n: int
    wgs_per_cu: int                 # CTAs of the largest tile a CU holds at once
    efficiency: float               # matrix-unit fraction of peak a steady K-loop sustains
    tile_min: int = 0               # smallest tile side (0: tile_m x tile_n only)
    simt_efficiency: float = 0.0    # the same for fp32 / fp64 on CUDA cores (0: `efficiency`)
    wave_fixed_s: float = 0.0       # per-wave pipeline fill + epilogue drain latency
    l2_bw_bytes_per_s: float = math.inf     # L2 -> SM operand feed bandwidth
    smem_per_cu_bytes: float = math.inf     # shared memory per CU (limits CTAs per CU)
    pipeline_stages: int = 3        # K-blocks in flight per CTA (multistage mainloop)
    k_block_bytes: int = 64         # bytes of K per mainloop step (32 fp16, 16 tf32)
    split_k_max: int = 1
    swizzle: int = 1                # 1: squarish raster bands (CUTLASS swizzle), 0: row-major
    bypass_llc_output: bool = False  # T3 uncached outputs are decided per run, not here

    def __post_init__(self) -> None:
        if min(self.tile_m, self.tile_n, self.wgs_per_cu, self.pipeline_stages,
               self.k_block_bytes, self.split_k_max) < 1:
            raise ValueError(f"gemm tiling {self} needs positive tile sizes and counts")
        if not 0 < self.efficiency <= 1 or not 0 <= self.simt_efficiency <= 1:
            raise ValueError(f"gemm efficiency={self.efficiency} must be in (0, 1]")

    @classmethod
    def from_quantities(cls, q: Mapping[str, float], where: str) -> "GemmTiling":
        """From a preset's [gemm] numbers (units already SI); names a missing key."""
        for key in ("tile_m", "tile_n", "wgs_per_cu", "efficiency"):
            if key not in q:
                raise ValueError(f"{where}: missing {key!r}")
        ints = ("tile_m", "tile_n", "wgs_per_cu", "tile_min", "pipeline_stages",
                "k_block_bytes", "split_k_max", "swizzle")
        si = {"l2_bw": "l2_bw_bytes_per_s", "smem_per_cu": "smem_per_cu_bytes",
              "wave_fixed": "wave_fixed_s"}          # preset key (unit stripped) -> field
        names = {f.name for f in fields(cls)} - {"bypass_llc_output"}
        kw: dict[str, Any] = {}
        for key, v in q.items():
            name = si.get(key, key)
            if name not in names:
                raise ValueError(f"{where}: unknown key {key!r}; known: "
                                 f"{sorted(set(names) - set(si.values()) | set(si))}")
            kw[name] = int(v) if name in ints else float(v)
        return cls(**kw)

    @property
    def largest_side(self) -> int:
        return max(self.tile_m, self.tile_n)


@dataclass(frozen=True)
class KernelSpec:
    """Non-GEMM kernel rates of a GPU (preset [kernels]; defaults for presets without it).

    `sfu_per_clock_per_cu`: special-function results (exp2, rcp) per clock per SM, CUDA C
    Programming Guide "Arithmetic Instructions" (16 for compute capability 5.x-9.0).
    `flash_block_q`, `flash_block_k`: FlashAttention-2's query / key block sizes.
    """

    sfu_per_clock_per_cu: float = 16.0
    flash_block_q: int = 128
    flash_block_k: int = 64

    @classmethod
    def from_quantities(cls, q: Mapping[str, float]) -> "KernelSpec":
        ints = ("flash_block_q", "flash_block_k")
        names = {f.name for f in fields(cls)}
        kw: dict[str, Any] = {k: (int(v) if k in ints else float(v)) for k, v in q.items()
                              if k in names}
        return cls(**kw)


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator as a rank plays it: compute, memory hierarchy, launch cost."""

    name: str
    kind: str
    peak_flops_per_s: Mapping[str, float]       # matrix-unit peak per dtype
    vector_flops_per_s: float                   # non-matrix (elementwise) peak, fp32
    dram_bw_bytes_per_s: float
    dram_capacity_bytes: float
    llc_bytes: float
    compute_units: int
    clock_hz: float
    kernel_launch_s: float
    dram_efficiency: float                      # fraction of DRAM peak streaming kernels reach
    gemm: GemmTiling
    link: LinkSpec
    kernels: KernelSpec = KernelSpec()
    description: str = ""
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)
    extra: Mapping[str, float] = field(default_factory=dict, compare=False)

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

    def peak(self, dtype: str) -> float:
        """Matrix-unit peak flop/s for an emulated dtype."""
        try:
            return self.peak_flops_per_s[dtype]
        except KeyError:
            raise ValueError(f"device {self.name} has no peak for dtype={dtype!r}; it has "
                             f"{sorted(self.peak_flops_per_s)}") from None

    def at_core_clock(self, hz: float) -> "DeviceSpec":
        """This device with its SM clock set to `hz` (memory clock unchanged): matrix,
        vector, SFU and L2 rates scale with the clock, as when a profiler locks it."""
        if hz <= 0:
            raise ValueError(f"device {self.name}: clock {hz} Hz must be > 0")
        f = hz / self.clock_hz
        gemm = replace(self.gemm, l2_bw_bytes_per_s=self.gemm.l2_bw_bytes_per_s * f,
                       wave_fixed_s=self.gemm.wave_fixed_s / f)
        return replace(self, clock_hz=hz, vector_flops_per_s=self.vector_flops_per_s * f,
                       peak_flops_per_s={k: v * f for k, v in self.peak_flops_per_s.items()},
                       gemm=gemm)

    @property
    def sfu_ops_per_s(self) -> float:
        """Special-function (exp) results per second over the whole device."""
        return self.kernels.sfu_per_clock_per_cu * self.compute_units * self.clock_hz

    @property
    def dram_stream_bw(self) -> float:
        """DRAM bandwidth a streaming kernel actually gets (bytes/s)."""
        return self.dram_bw_bytes_per_s * self.dram_efficiency

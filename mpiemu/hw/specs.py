"""Hardware descriptions: frozen dataclasses with SI units in every field name.

Presets (TOML data files beside this module) are turned into these specs by
`mpiemu.hw.presets`; every number there carries its source.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

DTYPE_BYTES: dict[str, int] = {"fp16": 2, "bf16": 2, "fp32": 4, "fp64": 8}
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
    """How the GPU BLAS tiles a GEMM into workgroups (thesis 2.4.1.3, 8.1.2)."""

    tile_m: int
    tile_n: int
    wgs_per_cu: int                 # workgroups a CU holds at once (occupancy)
    efficiency: float               # fraction of peak a full wave reaches
    bypass_llc_output: bool = False  # T3 uncached outputs are decided per run, not here


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

    @property
    def dram_stream_bw(self) -> float:
        """DRAM bandwidth a streaming kernel actually gets (bytes/s)."""
        return self.dram_bw_bytes_per_s * self.dram_efficiency

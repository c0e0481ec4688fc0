"""The Sunway-only numbers of a preset's `[sunway]` section, in SI units, with derived rates.

Rates in the preset are for the whole device the rank plays (a processor in all-shared mode,
one CG in single-CG mode); per-CG and per-CPE values are derived here (SWA 2.3).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Mapping

from ..specs import DeviceSpec, SunwayParams, dtype_bytes

MODES = ("all-shared", "single-cg")


@dataclass(frozen=True)
class SunwaySpec(SunwayParams):
    """CG / CPE / LDM / DMA / RMA description of one Sunway rank (SWA 2.3): the device's
    `[sunway]` capabilities plus the rates it shares with every device kind."""

    clock_hz: float
    peak_flops_per_s: Mapping[str, float]
    gemm_efficiency: float
    launch_s: float
    dram_capacity_bytes: float

    @property
    def mode(self) -> str:
        return "all-shared" if self.core_groups > 1 else "single-cg"

    # --- per-CG DMA engine (derived) -------------------------------------------------------
    def _peak_from_measured(self, measured: float) -> float:
        """Per-CG streaming rate that, with the per-request overhead, gives the measured rate
        for SWA 4.3's request size (16 KiB)."""
        b = self.dma_measured_request_bytes
        return b / (b / (measured / self.core_groups) - self.dma_request_overhead_s)

    @property
    def dma_load_cg(self) -> float:
        return self._peak_from_measured(self.dma_load_bytes_per_s)

    @property
    def dma_store_cg(self) -> float:
        return self._peak_from_measured(self.dma_store_bytes_per_s)

    def dma_s(self, nbytes: float, requests: float, store: bool = False) -> float:
        """Engine time of `requests` DMA requests moving `nbytes` in total on one CG."""
        bw = self.dma_store_cg if store else self.dma_load_cg
        return requests * self.dma_request_overhead_s + nbytes / bw

    # --- compute rates ------------------------------------------------------------------------
    def cpe_peak(self, dtype: str) -> float:
        """Peak flop/s of one CPE (14 TFLOPS / 384 for FP32)."""
        try:
            peak = self.peak_flops_per_s[dtype]
        except KeyError:
            raise ValueError(f"sunway has no peak for dtype={dtype!r}; it has "
                             f"{sorted(self.peak_flops_per_s)}") from None
        return peak / (self.core_groups * self.cpes_per_cg)

    def cpe_gemm_rate(self, dtype: str) -> float:
        """flop/s of the LDM micro-kernel on one CPE."""
        return self.cpe_peak(dtype) * self.gemm_efficiency

    def cycles_s(self, cycles: float) -> float:
        return cycles / self.clock_hz

    @property
    def rma_cg(self) -> float:
        """RMA bytes/s of one CG's network (ASSUMPTION: SWA's 460 GB/s is per CG)."""
        return self.rma_bytes_per_s

    @property
    def rma_port(self) -> float:
        """RMA bytes/s one CPE can receive (the CG's network split over its 64 CPEs)."""
        return self.rma_bytes_per_s / self.cpes_per_cg

    def lanes(self, dtype: str) -> int:
        """SIMD lanes of a 512-bit vector for a dtype."""
        return self.simd_bits // (8 * dtype_bytes(dtype))

    @classmethod
    def for_device(cls, device: DeviceSpec) -> SunwaySpec:
        """The rank's Sunway description: `device.sunway` (the preset's `[sunway]` section,
        overrides applied) with the clock, peaks, GEMM efficiency and launch of `device`."""
        if device.kind != "sunway" or device.sunway is None:
            raise ValueError(f"device {device.name} is kind {device.kind!r}, not 'sunway' "
                             "with a [sunway] section")
        own = {f.name: getattr(device.sunway, f.name) for f in fields(SunwayParams)}
        return cls(**own, clock_hz=device.clock_hz,
                   peak_flops_per_s=dict(device.peak_flops_per_s),
                   gemm_efficiency=device.gemm.efficiency, launch_s=device.kernel_launch_s,
                   dram_capacity_bytes=device.dram_capacity_bytes)

"""The Sunway-only numbers of a preset's `[sunway]` section, in SI units, with derived rates.

Rates in the preset are for the whole device the rank plays (a processor in all-shared mode,
one CG in single-CG mode); per-CG and per-CPE values are derived here (SWA 2.3).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

from ..presets import PresetError, Quantity, all_quantities, read_preset
from ..specs import DeviceSpec, dtype_bytes

MODES = ("all-shared", "single-cg")
MAY_BE_ZERO = ("dma_request_overhead_s", "rma_latency_s")


@dataclass(frozen=True)
class SunwaySpec:
    """CG / CPE / LDM / DMA / RMA description of one Sunway rank (SWA 2.3)."""

    core_groups: int
    cpes_per_cg: int
    cpe_mesh: int
    ldm_bytes: float
    ldm_usable_bytes: float
    dram_per_cg_bytes: float
    dma_theoretical_bytes_per_s: float
    dma_load_bytes_per_s: float
    dma_store_bytes_per_s: float
    dma_measured_request_bytes: float
    dma_request_overhead_s: float
    rma_bytes_per_s: float
    rma_latency_s: float
    kv_dma_copies: int
    exp_cycles: float
    rng_cycles: float
    vec_op_cycles: float
    convert_cycles: float
    simd_stream_cycles: float
    clock_hz: float
    peak_flops_per_s: Mapping[str, float]
    gemm_efficiency: float
    launch_s: float
    dram_capacity_bytes: float

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, (int, float)) and (v < 0 or (v == 0 and f.name not in MAY_BE_ZERO)):
                raise PresetError(f"sunway.{f.name}={v} must be > 0")
        if self.cpe_mesh ** 2 != self.cpes_per_cg:
            raise PresetError(f"sunway.cpe_mesh={self.cpe_mesh}: mesh^2 must equal "
                              f"cpes_per_cg={self.cpes_per_cg}")
        if self.kv_dma_copies not in (1, self.cpes_per_cg):
            raise PresetError(f"sunway.kv_dma_copies={self.kv_dma_copies}: choose 1 (broadcast) "
                              f"or {self.cpes_per_cg} (one private copy per CPE)")
        if self.dma_request_overhead_s * self.dma_load_bytes_per_s / self.core_groups \
                >= self.dma_measured_request_bytes:
            raise PresetError("sunway.dma_request_overhead is longer than a measured request")
        if not self.ldm_usable_bytes <= self.ldm_bytes:
            raise PresetError("sunway.ldm_usable must not exceed sunway.ldm")

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
        return 512 // (8 * dtype_bytes(dtype))

    @classmethod
    def from_preset(cls, raw: Mapping[str, Any], device: DeviceSpec) -> SunwaySpec:
        """Parse `[sunway]` of a raw preset; rates shared with DeviceSpec come from `device`."""
        q: dict[str, Quantity] = all_quantities(raw).get("sunway", {})

        def need(key: str) -> float:
            if key not in q:
                raise PresetError(f"{device.name}.sunway: missing {key!r}")
            return q[key].value

        return cls(
            core_groups=int(need("core_groups")), cpes_per_cg=int(need("cpes_per_cg")),
            cpe_mesh=int(need("cpe_mesh")), ldm_bytes=need("ldm"),
            ldm_usable_bytes=need("ldm_usable"), dram_per_cg_bytes=need("dram_per_cg"),
            dma_theoretical_bytes_per_s=need("dma_theoretical"),
            dma_load_bytes_per_s=need("dma_load"), dma_store_bytes_per_s=need("dma_store"),
            dma_measured_request_bytes=need("dma_measured_request"),
            dma_request_overhead_s=need("dma_request_overhead"),
            rma_bytes_per_s=need("rma"), rma_latency_s=need("rma_latency"),
            kv_dma_copies=int(need("kv_dma_copies")), exp_cycles=need("exp_cycles"),
            rng_cycles=need("rng_cycles"), vec_op_cycles=need("vec_op_cycles"),
            convert_cycles=need("convert_cycles"), simd_stream_cycles=need("simd_stream_cycles"),
            clock_hz=device.clock_hz,
            peak_flops_per_s=dict(device.peak_flops_per_s),
            gemm_efficiency=device.gemm.efficiency, launch_s=device.kernel_launch_s,
            dram_capacity_bytes=device.dram_capacity_bytes)

    @classmethod
    def for_device(cls, device: DeviceSpec) -> SunwaySpec:
        """The SunwaySpec of a bundled preset named like `device` (its `name` key)."""
        if device.kind != "sunway":
            raise ValueError(f"device {device.name} is kind {device.kind!r}, not 'sunway'")
        return cls.from_preset(read_preset(device.name), device)

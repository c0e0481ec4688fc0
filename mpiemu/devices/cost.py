"""What a device's work costs, per device kind, behind one narrow interface (ASTRA-sim's
Roofline idea).

An executor asks a `DeviceCost` three things: how long a GEMM takes (with its stages), how
long a memory-bound elementwise kernel takes, and how long a ring step's reduction takes.
"""
from __future__ import annotations

from typing import Protocol

from .gemm import NO_EPILOGUE, Epilogue, GemmCost, gemm_cost
from .specs import DeviceSpec, dtype_bytes


class DeviceCost(Protocol):
    """What an executor and the collectives ask of a device."""

    spec: DeviceSpec

    def gemm(self, m: int, n: int, k: int, *, dtype: str = "fp16", batch: int = 1,
             bypass_llc_output: bool = False, compute_units: int | None = None,
             layout: str = "NN", epilogue: Epilogue = NO_EPILOGUE) -> GemmCost: ...

    def elementwise_s(self, read_bytes: float, write_bytes: float, flops: float = 0.0,
                      *, launch: bool = True, sfu_ops: float = 0.0,
                      bw_util: float = 1.0) -> float: ...

    def reduction_s(self, n_elems: int, elem_bytes: float) -> float: ...


class GpuCost:
    """Roofline-per-wave GEMMs and bandwidth-bound elementwise kernels on a GPU."""

    def __init__(self, spec: DeviceSpec) -> None:
        self.spec = spec
        self._gemm_cache: dict[tuple[object, ...], GemmCost] = {}

    def gemm(self, m: int, n: int, k: int, *, dtype: str = "fp16", batch: int = 1,
             bypass_llc_output: bool = False, compute_units: int | None = None,
             layout: str = "NN", epilogue: Epilogue = NO_EPILOGUE) -> GemmCost:
        """Cost of C[M,N] = op(A)[M,K] op(B)[K,N], `batch` times; cached per shape.

        `compute_units` < the device's: the GEMM shares the GPU with a communication kernel.
        tf32 operands are stored as fp32 and C is written in fp32.
        """
        key = (m, n, k, dtype, batch, bypass_llc_output, compute_units, layout, epilogue)
        cost = self._gemm_cache.get(key)
        if cost is None:
            eb = dtype_bytes(dtype)
            cost = gemm_cost(self.spec, m, n, k, dtype=dtype, batch=batch, in_bytes=eb,
                             out_bytes=eb, bypass_llc_output=bypass_llc_output,
                             compute_units=compute_units, layout=layout, epilogue=epilogue)
            self._gemm_cache[key] = cost
        return cost

    def elementwise_s(self, read_bytes: float, write_bytes: float, flops: float = 0.0,
                      *, launch: bool = True, sfu_ops: float = 0.0,
                      bw_util: float = 1.0) -> float:
        """max(bytes / the bandwidth it reaches, flops / vector peak, exp / SFU rate) plus a
        launch; `bw_util` is its share of the achievable streaming bandwidth."""
        body = max((read_bytes + write_bytes) / (self.spec.dram_stream_bw * bw_util),
                   flops / self.spec.vector_flops_per_s, sfu_ops / self.spec.sfu_ops_per_s)
        return body + (self.spec.kernel_launch_s if launch else 0.0)

    def reduction_s(self, n_elems: int, elem_bytes: float) -> float:
        """One ring step's reduction: read local and received copies, write the sum.

        Runs inside the collective kernel, so no launch is charged (thesis Fig. 8.8(a)).
        """
        return self.elementwise_s(2.0 * n_elems * elem_bytes, 1.0 * n_elems * elem_bytes,
                                  float(n_elems), launch=False)


def device_cost(spec: DeviceSpec) -> DeviceCost:
    """The cost of the device's kind."""
    if spec.kind == "gpu":
        return GpuCost(spec)
    if spec.kind == "sunway":
        from .sunway import SunwayCost  # noqa: PLC0415 (only Sunway runs need it)
        return SunwayCost(spec)
    raise ValueError(f"device.kind={spec.kind!r} has no cost; choose 'gpu' or 'sunway'")

"""Charging modelled compute to a timeline: the glue between a device's cost and the clock."""
from __future__ import annotations

from typing import Iterable

from ..devices.cost import DeviceCost
from ..devices.gemm import NO_EPILOGUE, Epilogue
from .timeline import COMPUTE, SimTime, Span, Timeline


def gemm(tl: Timeline, cost: DeviceCost, name: str, m: int, n: int, k: int, *,
         dtype: str, after: SimTime | Iterable[SimTime] = 0.0, batch: int = 1,
         resource: str = COMPUTE, epilogue: Epilogue = NO_EPILOGUE) -> Span:
    """Place C[M,N] = A[M,K] B[K,N] (x batch); the event's `stage` holds its stage count.
    While collective kernels hold SMs, it runs on the SMs left (`sim.sms`)."""
    g = cost.gemm(m, n, k, dtype=dtype, batch=batch, epilogue=epilogue)
    t0 = tl.earliest([resource], after)
    cus = cost.spec.compute_units

    def shared_s(held: int) -> float:
        return cost.gemm(m, n, k, dtype=dtype, batch=batch, epilogue=epilogue,
                         compute_units=max(1, cus - held)).time_s

    duration = tl.sms.stretch(t0, g.time_s, shared_s, forget_before=resource == COMPUTE)
    return tl.place(name, [resource], t0, t0 + duration, cat="compute", flops=g.flops,
                    dram_bytes=g.dram_bytes, stage=g.n_stages)


def elementwise(tl: Timeline, cost: DeviceCost, name: str, read_bytes: float,
                write_bytes: float, flops: float = 0.0, *,
                after: SimTime | Iterable[SimTime] = 0.0, resource: str = COMPUTE,
                sfu_ops: float = 0.0, bw_util: float = 1.0) -> Span:
    """Place a memory-bound kernel: bytes over streaming bandwidth plus a launch."""
    t = cost.elementwise_s(read_bytes, write_bytes, flops, sfu_ops=sfu_ops, bw_util=bw_util)
    return tl.reserve(name, [resource], t, after, cat="compute", flops=flops,
                      dram_bytes=read_bytes + write_bytes)

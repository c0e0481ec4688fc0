"""Executors by device kind: what a rank is built from, and the class that runs its ops.

A GPU rank charges each op as it comes (`gpu.GpuExecutor`); a Sunway rank charges a layer's
pass as one SwFormer CG schedule (`sunway.SunwayExecutor`, which builds its own plan).
Modules are imported when their kind is asked for: only Sunway runs load the Sunway model.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from ..comm.p2p import TimedComm
from ..devices.cost import DeviceCost
from ..devices.gemm import Epilogue
from ..model.dims import Dims
from ..model.executor import Executor, KernelOptions
from ..overlap.strategy import Overlap
from ..precision.fp8_gemm import Fp8Gemm
from ..precision.matmul import PrecisionGemm
from ..sim.timeline import Timeline

# device kind -> "module:class" of its executor
EXECUTORS: dict[str, str] = {
    "gpu": "mpiemu.executors.gpu:GpuExecutor",
    "sunway": "mpiemu.executors.sunway:SunwayExecutor",
}


@dataclass(frozen=True)
class ExecutorSetup:
    """What an executor of one rank is built from (each kind reads what it needs)."""

    tl: Timeline
    cost: DeviceCost                  # the device the rank plays
    tp: TimedComm
    dims: Dims                        # the rank's local sizes (a Sunway plan's layer shape)
    dtype: str                        # the emulated dtype
    numerics: bool
    overlap: Overlap
    kernels: KernelOptions = KernelOptions()
    tp_async: bool = True             # Megatron's asynchronous TP gradient reduction
    # Megatron's gradient buffer: a weight-gradient GEMM's [rows, cols] epilogue, or None
    wgrad_epilogue: Callable[[int, int], Epilogue] | None = None
    cp: TimedComm | None = None       # the context-parallel group (parallel.cp > 1)
    ep: TimedComm | None = None       # the expert-parallel group (a model with experts)
    etp: TimedComm | None = None      # the expert tensor-parallel group (parallel.etp > 1)
    etp_ep: TimedComm | None = None   # expert TP x EP together (None: the ep group)
    sunway_scheduler: str = "ka"      # [sunway] scheduler and attention kernel
    sunway_attention: str = "swattention"
    # the numerics' GEMMs (`run.numeric_dtype`): exact numpy, or bf16 / fp16 as tensor cores
    precision: PrecisionGemm = PrecisionGemm("fp32")
    # [fp8] recipe: the transformer layers' linear GEMMs charged at the FP8 rate, with the
    # recipe's casts ("off": the emulated dtype's)
    fp8: str = "off"
    # numerics on under an [fp8] recipe: those GEMMs' math (casts, scales, amax reduction)
    fp8_gemm: Fp8Gemm | None = None
    fp8_params: bool = False          # FP8 weights gathered (optimizer.fp8_param_gather)


def make_executor(kind: str, setup: ExecutorSetup) -> Executor:
    """The executor of a rank playing a device of this kind."""
    if kind not in EXECUTORS:
        raise ValueError(f"device.kind={kind!r} has no executor; choose one of "
                         f"{sorted(EXECUTORS)}")
    module, cls = EXECUTORS[kind].split(":")
    return getattr(importlib.import_module(module), cls)(setup)  # type: ignore[no-any-return]

"""Hardware layer: device and link specs, presets with sources, cost models."""
from .cost import ComputeModel, GpuModel, model_for
from .gemm import GemmCost, GemmStage, gemm_cost
from .presets import PresetError, list_presets, load_device, read_preset
from .specs import DTYPE_BYTES, DeviceSpec, GemmTiling, LinkSpec, dtype_bytes

__all__ = [
    "ComputeModel", "DTYPE_BYTES", "DeviceSpec", "GemmCost", "GemmStage", "GemmTiling",
    "GpuModel", "LinkSpec", "PresetError", "dtype_bytes", "gemm_cost", "list_presets",
    "load_device", "model_for", "read_preset",
]

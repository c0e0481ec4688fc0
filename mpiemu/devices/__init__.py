"""The devices ranks play: specs, presets with sources, what their work costs (`DeviceCost`).

The network between them is `mpiemu.net`.
"""
from .cost import DeviceCost, GpuCost, device_cost
from .gemm import GemmCost, GemmStage, gemm_cost
from .presets import PresetError, list_presets, load_device, read_preset
from .specs import DTYPE_BYTES, DeviceSpec, GemmTiling, dtype_bytes

__all__ = [
    "DeviceCost", "DTYPE_BYTES", "DeviceSpec", "GemmCost", "GemmStage", "GemmTiling",
    "GpuCost", "PresetError", "dtype_bytes", "gemm_cost", "list_presets",
    "load_device", "device_cost", "read_preset",
]

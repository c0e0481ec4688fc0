"""Numpy transformer: TP/SP layers, bucketed DP, Adam/LAMB, the one-process reference.

Only the MPI-free pieces are re-exported here (configs, presets), so that reading a
workload does not start MPI; the sharded model lives in `mpiemu.model.stage`.
"""
from .config import ModelConfig, OptimizerConfig
from .presets import ModelPreset, list_model_presets, load_model_preset

__all__ = ["ModelConfig", "ModelPreset", "OptimizerConfig", "list_model_presets",
           "load_model_preset"]

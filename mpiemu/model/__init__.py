"""The transformer, device-neutral: its config and presets, a rank's local sizes and
parameter shards, the layers (Megatron tensor and sequence parallelism), attention numerics
(dense, flash, softmax recomposition, SWattention), a pipeline stage and the pipeline
schedules, and the executor protocol its ops are charged through (`executors/`).

Only the MPI-free pieces are re-exported here (config, presets), so that reading a workload
does not start MPI; a rank's stage lives in `mpiemu.model.stage`.
"""
from .config import ModelConfig
from .presets import ModelPreset, list_model_presets, load_model_preset

__all__ = ["ModelConfig", "ModelPreset", "list_model_presets", "load_model_preset"]

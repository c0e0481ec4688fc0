"""Precision: the number formats, FP8 scaling recipes, FP16 loss scaling and GEMMs in a
precision that emulated numerics run in (Transformer Engine's and Megatron-Core's rules,
modern_training.md §7).

- `formats.py`: bf16, fp16, E4M3, E5M2 as ml_dtypes rounds them (FP8 saturating);
- `scaling.py`: the delayed (amax history, margin), current and block (1 x 128 / 128 x 128)
  recipes' scales and casts;
- `loss_scale.py`: Megatron's dynamic loss scaler for FP16;
- `matmul.py`: C = A B with operands cast as tensor cores take them, fp32 accumulation, the
  output rounded.
"""
from .formats import FORMATS, Format, round_to
from .loss_scale import DynamicLossScaler
from .matmul import Fp8Recipe, PrecisionGemm

__all__ = ["FORMATS", "Format", "round_to", "DynamicLossScaler", "Fp8Recipe", "PrecisionGemm"]

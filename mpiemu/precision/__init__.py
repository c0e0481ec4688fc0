"""Precision: the number formats, FP8 scaling recipes, FP16 loss scaling and GEMMs in a
precision that emulated numerics run in (Transformer Engine's and Megatron-Core's rules,
modern_training.md §7).

- `formats.py`: bf16, fp16, E4M3, E5M2 as ml_dtypes rounds them (FP8 saturating);
- `scaling.py`: the delayed (amax history, margin), current and block (1 x 128 / 128 x 128)
  recipes' scales and casts;
- `loss_scale.py`: Megatron's dynamic loss scaler for FP16;
- `matmul.py`: C = A B in bf16 / fp16 (operands rounded, fp32 accumulation, output rounded);
- `fp8_gemm.py`: a layer's linear GEMMs in FP8 under a recipe (casts, amax reduction, the
  delayed scales' updates, FP8 weight copies reused over micro-batches);
- `cast_costs.py`: the cast, transpose and amax kernels each recipe adds (their time).
"""
from .formats import FORMATS, Format, round_to
from .fp8_gemm import Fp8Gemm, Fp8Recipe
from .loss_scale import DynamicLossScaler
from .matmul import PrecisionGemm

__all__ = ["FORMATS", "Format", "round_to", "DynamicLossScaler", "Fp8Gemm", "Fp8Recipe",
           "PrecisionGemm"]

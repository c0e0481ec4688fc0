"""Fused compute-communication schedules: GEMM -> ring RS / AR, ring AG -> GEMM."""
from .api import (MODES, STRATEGIES, STRATEGY_IMPLS, GemmShape, Overlap, gather_then_gemm,
                  gemm_then_reduce)

__all__ = ["GemmShape", "MODES", "Overlap", "STRATEGIES", "STRATEGY_IMPLS", "gather_then_gemm",
           "gemm_then_reduce"]

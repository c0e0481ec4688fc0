"""Fused compute-communication schedules: GEMM -> ring RS / AR, ring AG -> GEMM.

`strategy` is importable without MPI; `api` (and the fused executors) use MPI.
"""
from .strategy import MODES, STRATEGIES, Overlap

__all__ = ["MODES", "Overlap", "STRATEGIES"]

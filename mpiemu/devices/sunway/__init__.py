"""Sunway SW26010pro as an emulated device: CG/CPE/LDM/DMA/RMA costs (SWA, SwFormer)."""
from .blocks import Blocks, ldm_bytes, paper_blocks
from .gemm import SunwayGemmCost, Tiling, best_gemm, pad_free_tilings, tiled_cost
from .cost import AttentionCost, AttnShape, SunwayCost, SunwayOutOfMemory
from .spec import MODES, SunwaySpec

__all__ = ["AttentionCost", "AttnShape", "Blocks", "MODES", "SunwayGemmCost", "SunwayCost",
           "SunwayOutOfMemory", "SunwaySpec", "Tiling", "best_gemm", "ldm_bytes",
           "pad_free_tilings", "paper_blocks", "tiled_cost"]

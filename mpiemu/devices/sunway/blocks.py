"""SWattention block sizes: the LDM equations 2 and 3 of SWA 3.3 and the choice of Br, Bc.

`paper_blocks` returns the sizes SWA 4.2 reports using (they include swBLAS limits for FP16);
`search_blocks` enumerates powers of two that fit the usable LDM and lets a cost function pick.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..specs import dtype_bytes

PASSES = ("fwd", "bwd")
CANDIDATES = (8, 16, 32, 64, 128, 256, 512)


@dataclass(frozen=True)
class Blocks:
    """Row block Br (Q, O, l, m; one per CPE) and column block Bc (K, V; all CPEs share)."""

    br: int
    bc: int

    def __post_init__(self) -> None:
        if self.br < 1 or self.bc < 1:
            raise ValueError(f"block sizes must be >= 1, got Br={self.br} Bc={self.bc}")


def ldm_elems(pass_: str, br: int, bc: int, h: int) -> int:
    """Elements of LDM a CPE needs: SWA Eq. 2 (forward) and Eq. 3 (backward)."""
    if pass_ == "fwd":
        return 2 * br * h + 3 * bc * h + br * bc
    if pass_ == "bwd":
        return 4 * br * h + 4 * bc * h + 3 * br * bc + bc * max(br, h)
    raise ValueError(f"pass={pass_!r}; choose one of {list(PASSES)}")


def ldm_bytes(pass_: str, br: int, bc: int, h: int, dtype: str) -> int:
    """LDM bytes of a tiling; FP16 halves the FP32 figure (SWA 3.3)."""
    return ldm_elems(pass_, br, bc, h) * dtype_bytes(dtype)


def paper_blocks(pass_: str, dtype: str, h: int, s: int) -> Blocks:
    """The sizes SWA 4.2 uses (FP32: Br=16 at S=1024 so all 64 CPEs work)."""
    if dtype == "fp16":
        if pass_ == "fwd":
            return Blocks(64, 128)                       # all S (swBLAS lacks better sizes)
        return Blocks(64, 128) if h <= 64 else Blocks(64, 64)
    if pass_ == "fwd":
        br = 16 if s <= 1024 else 32
        return Blocks(br, 256 if h <= 64 else 128)
    return Blocks(32, 128) if h <= 64 else Blocks(16, 64)


def fitting_blocks(pass_: str, dtype: str, h: int, s: int, ldm_budget_bytes: float,
                   cpes: int = 64) -> list[Blocks]:
    """Power-of-two (Br, Bc) that fit the LDM budget and keep every CPE busy when S allows."""
    rows = [br for br in CANDIDATES if cpes * br <= max(s, cpes * CANDIDATES[0])]
    cols = [bc for bc in CANDIDATES if bc <= max(s, CANDIDATES[0])]
    return [Blocks(br, bc) for br in rows for bc in cols
            if ldm_bytes(pass_, br, bc, h, dtype) <= ldm_budget_bytes]


def search_blocks(pass_: str, dtype: str, h: int, s: int, ldm_budget_bytes: float,
                  cost: Callable[[Blocks], float]) -> Blocks:
    """The fitting tiling of least modelled time (SWA 3.3's tiling strategy, by model)."""
    cands = fitting_blocks(pass_, dtype, h, s, ldm_budget_bytes)
    if not cands:
        raise ValueError(f"no (Br, Bc) fits {ldm_budget_bytes / 1024:.0f} KiB of LDM for "
                         f"{pass_} H={h} {dtype}")
    return min(cands, key=lambda b: (cost(b), -b.br * b.bc))

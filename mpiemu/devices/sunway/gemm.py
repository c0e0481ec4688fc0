"""SwFormer intra-op GEMM on Sunway: pad-free tilings, LDM blocking per tile, waves over CGs.

A tiling splits C[M, N] into M_div x N_div tiles that divide M and N exactly (pad-free, SWF
App. A.2, Div_List 1..128). A CG computes one tile at a time: its 8x8 CPE mesh holds an
(tm/8) x (tn/8) block of C per CPE and streams K in chunks with double-buffered DMA (each
panel is read from DRAM once and shared along mesh rows / columns by RMA). Tiles go to the 6
CGs in waves; a partial last wave leaves CGs idle (SWF App. A.1). The best tiling is the one
of least modelled time (SWF's offline profiling, replayed on the model).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

from ..gemm import GemmCost, GemmStage
from ..specs import dtype_bytes
from .spec import SunwaySpec

DIV_LIST = tuple(range(1, 129))         # SWF App. A.2: numbers "usually range from 1 to 128"
MICRO_ROWS = 4                          # ASSUMPTION: register block of the micro-kernel (rows)
REQUEST_BYTES = 16 * 1024               # streaming DMA request size of elementwise kernels


@dataclass(frozen=True)
class Tiling:
    """M_div x N_div pad-free tiles; `fused` runs each CG's share of them as one fused tile."""

    m_div: int
    n_div: int
    fused: bool = False

    @property
    def tiles(self) -> int:
        return self.m_div * self.n_div


@dataclass(frozen=True)
class TileCost:
    """One tile on one CG."""

    tm: int
    tn: int
    k: int
    kc: int
    time_s: float
    read_bytes: float
    write_bytes: float
    fill_s: float = 0.0             # first K chunk in (DMA + RMA share)
    body_s: float = 0.0             # the K loop
    drain_s: float = 0.0            # C block out


@dataclass(frozen=True)
class SunwayGemmCost(GemmCost):
    """A GemmCost whose stages are waves of tiles over the CGs, with the tiling chosen."""

    tiling: Tiling = Tiling(1, 1)
    tile_s: float = 0.0             # one pad-free tile on one CG
    cgs: int = 6

    @property
    def tail_idle_cgs(self) -> int:
        """CGs without a tile in the last wave (SWF App. A.1's under-use)."""
        return self.cgs - self.stages[-1].tiles if self.stages else 0

    @property
    def cg_utilization(self) -> float:
        busy = sum(st.tiles * st.compute_s for st in self.stages)
        return busy / (self.cgs * sum(st.compute_s for st in self.stages))


Predicate = Callable[[int, int, int], bool]


def default_micro_kernel(tm: int, tn: int, k: int) -> bool:
    """ASSUMPTION (SWF gives no list): every mesh row/column gets >= 1 row/column of C."""
    return tm % 8 == 0 and tn % 8 == 0


def min_tile(rows: int, cols: int) -> Predicate:
    """A micro-kernel constraint: tiles of at least rows x cols (and 8-multiples)."""
    def valid(tm: int, tn: int, k: int) -> bool:
        return default_micro_kernel(tm, tn, k) and tm >= rows and tn >= cols
    return valid


def _kc(sw: SunwaySpec, mb: int, nb: int, k: int, e: int) -> int:
    """Largest K chunk whose double-buffered A and B panels fit beside the C block in LDM."""
    room = sw.ldm_usable_bytes / e - mb * nb
    kc = int(room // (2 * (mb + nb)))
    return min(k, kc)


def tile_cost(sw: SunwaySpec, tm: int, tn: int, k: int, dtype: str) -> TileCost | None:
    """Time of one tm x tn x K tile on one CG, or None when its C block does not fit the LDM."""
    e = dtype_bytes(dtype)
    mesh = sw.cpe_mesh
    mb, nb = math.ceil(tm / mesh), math.ceil(tn / mesh)
    kc = _kc(sw, mb, nb, k, e)
    if kc < 1:
        return None
    chunks = math.ceil(k / kc)
    lanes = sw.lanes(dtype)
    rate = sw.cpe_gemm_rate(dtype) * min(1.0, nb / lanes) * min(1.0, mb / MICRO_ROWS)
    cpes = sw.cpes_per_cg
    per_chunk_bytes = (tm + tn) * kc * e
    load = sw.dma_s(per_chunk_bytes, 2 * cpes)                  # each CPE loads 1/8 of a panel
    share = sw.rma_latency_s + (mb + nb) * kc * e * (mesh - 1) / mesh / sw.rma_port
    compute = 2.0 * mb * nb * kc / rate
    store = sw.dma_s(tm * tn * e, cpes, store=True)
    body = (chunks - 1) * max(compute, load, share) + compute    # double-buffered K loop
    t = load + share + body + store                              # fill, loop, drain
    return TileCost(tm, tn, k, kc, t, (tm + tn) * k * e, tm * tn * e, load + share, body,
                    store)


def pad_free_tilings(m: int, n: int, k: int, dtype: str, sw: SunwaySpec,
                     valid: Predicate = default_micro_kernel) -> list[Tiling]:
    """Tilings whose M_div | M and N_div | N with the micro-kernel's shape constraints."""
    out = []
    for md in (d for d in DIV_LIST if m % d == 0):
        for nd in (d for d in DIV_LIST if n % d == 0):
            if valid(m // md, n // nd, k) and tile_cost(sw, m // md, n // nd, k, dtype):
                out.append(Tiling(md, nd))
    return out


def _waves(total: int, cgs: int) -> list[int]:
    full, tail = divmod(total, cgs)
    return [cgs] * full + ([tail] if tail else [])


def tiled_cost(sw: SunwaySpec, m: int, n: int, k: int, dtype: str, batch: int,
               tiling: Tiling, cgs: int | None = None) -> SunwayGemmCost:
    """Waves of `batch * M_div * N_div` tiles over `cgs` CGs (default all), or one fused tile
    per CG when the tiling is fused."""
    tm, tn = m // tiling.m_div, n // tiling.n_div
    tc = tile_cost(sw, tm, tn, k, dtype)
    if tc is None:
        raise ValueError(f"tile {tm}x{tn}x{k} does not fit the LDM")
    cgs = sw.core_groups if cgs is None else cgs
    if not 0 < cgs <= sw.core_groups:
        raise ValueError(f"compute_units={cgs} must lie in [1, {sw.core_groups}] CGs")
    total = batch * tiling.tiles
    waves = _waves(total, cgs)
    stages = [GemmStage(w, tc.time_s, w * tc.read_bytes, w * tc.write_bytes, math.inf)
              for w in waves]
    if tiling.fused and total >= cgs:
        stages = [_fused(tc, total, cgs)]
    return SunwayGemmCost(m, n, k, batch, 2.0 * m * n * k * batch, sw.launch_s, tuple(stages),
                          tiling=tiling, tile_s=tc.time_s, cgs=cgs)


def _fused(tc: TileCost, total: int, cgs: int) -> GemmStage:
    """Tile fusion (our reading of SWF App. A.2; the heuristic is not in the appendix): each CG
    takes a balanced run of consecutive pad-free tiles as one fused tile, so it fills its DMA
    pipeline once and overlaps each sub-tile's C store with the next one's K loop."""
    per = -(-total // cgs)
    t = tc.fill_s + per * max(tc.body_s, tc.drain_s) + tc.drain_s
    return GemmStage(cgs, t, total * tc.read_bytes, total * tc.write_bytes, math.inf)


def _pad(x: int) -> int:
    """Round up to a multiple of 8 (only when no pad-free tiling exists)."""
    return -(-x // 8) * 8


def tiling_time_s(sw: SunwaySpec, m: int, n: int, k: int, dtype: str, batch: int,
                  tiling: Tiling, cgs: int | None = None) -> float:
    """`tiled_cost(...).time_s` without building its waves (for searching many tilings)."""
    tc = tile_cost(sw, m // tiling.m_div, n // tiling.n_div, k, dtype)
    if tc is None:
        return math.inf
    c = sw.core_groups if cgs is None else cgs
    total = batch * tiling.tiles
    if tiling.fused and total >= c:
        return sw.launch_s + _fused(tc, total, c).time_s
    return sw.launch_s + math.ceil(total / c) * tc.time_s


def best_gemm(sw: SunwaySpec, m: int, n: int, k: int, dtype: str, batch: int = 1, *,
              fusion: bool = False, valid: Predicate = default_micro_kernel,
              cgs: int | None = None) -> SunwayGemmCost:
    """The pad-free (optionally fused) tiling of least modelled time."""
    if min(m, n, k, batch) <= 0:
        raise ValueError(f"GEMM dims must be positive, got M={m} N={n} K={k} batch={batch}")
    cands = pad_free_tilings(m, n, k, dtype, sw, valid)
    if not cands:
        mp, np_ = _pad(m), _pad(n)
        if (mp, np_) == (m, n):
            raise ValueError(f"GEMM {m}x{n}x{k} has no pad-free tiling that fits the LDM")
        padded = best_gemm(sw, mp, np_, k, dtype, batch, fusion=fusion, valid=valid, cgs=cgs)
        return replace(padded, m=m, n=n, flops=2.0 * m * n * k * batch)
    if fusion:
        cands += [Tiling(t.m_div, t.n_div, True) for t in cands]
    best = min(cands, key=lambda t: (tiling_time_s(sw, m, n, k, dtype, batch, t, cgs),
                                     t.tiles, t.fused))
    return tiled_cost(sw, m, n, k, dtype, batch, best, cgs)

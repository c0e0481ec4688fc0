"""GPU GEMM cost: output tiles -> workgroups -> stages (waves), a roofline per stage.

A GEMM's output is tiled; each workgroup (WG) computes one tile; the compute units hold
`compute_units * wgs_per_cu` WGs at once, so the GEMM runs in stages (thesis 2.4.1.3, 7.2.1,
8.1.2). Each stage costs max(compute, DRAM) time, so a partial last stage under-uses the device.
DRAM reads follow the last-level cache: inputs re-read only when they fall out of the LLC.
A GEMM sliced in K (tensor parallelism) keeps its tile and stage counts (thesis Fig. 8.3).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .specs import DeviceSpec


@dataclass(frozen=True)
class GemmStage:
    """One wave of workgroups: its tiles, isolated compute time and DRAM traffic."""

    tiles: int
    compute_s: float
    dram_read_bytes: float
    dram_write_bytes: float
    dram_bw: float

    @property
    def memory_s(self) -> float:
        return (self.dram_read_bytes + self.dram_write_bytes) / self.dram_bw

    @property
    def time_s(self) -> float:
        return max(self.compute_s, self.memory_s)

    @property
    def memory_intensity(self) -> float:
        """Fraction of the stage's time the DRAM is busy (0 = cache resident, 1 = bound)."""
        return self.memory_s / self.time_s if self.time_s > 0 else 0.0


@dataclass(frozen=True)
class GemmCost:
    """Modelled cost of C[M, N] = A[M, K] @ B[K, N] (optionally batched)."""

    m: int
    n: int
    k: int
    batch: int
    flops: float
    launch_s: float
    stages: tuple[GemmStage, ...]

    @property
    def time_s(self) -> float:
        return self.launch_s + sum(s.time_s for s in self.stages)

    @property
    def dram_read_bytes(self) -> float:
        return sum(s.dram_read_bytes for s in self.stages)

    @property
    def dram_write_bytes(self) -> float:
        return sum(s.dram_write_bytes for s in self.stages)

    @property
    def dram_bytes(self) -> float:
        return self.dram_read_bytes + self.dram_write_bytes

    @property
    def n_stages(self) -> int:
        return len(self.stages)


def _wave_span(first: int, count: int, tiles_n: int) -> tuple[range, range]:
    """Tile rows and columns touched by tiles [first, first+count) in row-major raster."""
    last = first + count - 1
    r0, r1 = first // tiles_n, last // tiles_n
    cols = range(tiles_n) if r1 > r0 else range(first % tiles_n, last % tiles_n + 1)
    return range(r0, r1 + 1), cols


def _stage_reads(rows: set[int], cols: set[int], prev_rows: set[int], prev_cols: set[int],
                 row_bytes: float, col_bytes: float, llc_bytes: float, tiles: int) -> float:
    """DRAM input bytes for one stage under an LRU-like last-level cache."""
    ws = len(rows) * row_bytes + len(cols) * col_bytes
    union = len(rows | prev_rows) * row_bytes + len(cols | prev_cols) * col_bytes
    if union <= llc_bytes:            # previous stage's panels are still cached
        return len(rows - prev_rows) * row_bytes + len(cols - prev_cols) * col_bytes
    if ws <= llc_bytes:               # the stage's own panels are reused across its WGs
        return ws
    per_tile = tiles * (row_bytes + col_bytes)   # thrashing: each WG streams its own panels
    return min(per_tile, ws * ws / llc_bytes)


def gemm_cost(spec: DeviceSpec, m: int, n: int, k: int, *, dtype: str = "fp16",
              batch: int = 1, in_bytes: int = 2, out_bytes: int = 2,
              bypass_llc_output: bool = False, compute_units: int | None = None) -> GemmCost:
    """Stage-by-stage cost of a (batched) GEMM on a GPU.

    `bypass_llc_output` models T3's uncached output writes (thesis 8.3.3): output tiles no
    longer occupy the LLC, leaving it all for input panels. `compute_units` runs the GEMM on
    fewer CUs than the device has (the rest run a communication kernel, thesis Fig. 8.4):
    smaller waves, so more stages at the same per-CU rate.
    """
    if min(m, n, k, batch) <= 0:
        raise ValueError(f"GEMM dims must be positive, got M={m} N={n} K={k} batch={batch}")
    g = spec.gemm
    tiles_m, tiles_n = math.ceil(m / g.tile_m), math.ceil(n / g.tile_n)
    per_gemm = tiles_m * tiles_n
    total = per_gemm * batch
    cus = spec.compute_units if compute_units is None else compute_units
    if not 0 < cus <= spec.compute_units:
        raise ValueError(f"compute_units={compute_units} must lie in [1, {spec.compute_units}]")
    wave = cus * g.wgs_per_cu
    cu_rate = spec.peak(dtype) * g.efficiency / spec.compute_units
    tile_flops = 2.0 * g.tile_m * g.tile_n * k
    row_bytes = min(g.tile_m, m) * k * in_bytes      # one tile-row panel of A
    col_bytes = min(g.tile_n, n) * k * in_bytes      # one tile-column panel of B
    tile_out = min(g.tile_m, m) * min(g.tile_n, n) * out_bytes
    bw = spec.dram_stream_bw
    stages: list[GemmStage] = []
    prev_rows: set[int] = set()
    prev_cols: set[int] = set()
    for first in range(0, total, wave):
        count = min(wave, total - first)
        out_bytes_stage = count * tile_out
        llc = spec.llc_bytes - (0.0 if bypass_llc_output else min(out_bytes_stage,
                                                                    spec.llc_bytes / 2))
        rows, cols = _stage_panels(first, count, per_gemm, tiles_n)
        reads = _stage_reads(rows, cols, prev_rows, prev_cols, row_bytes, col_bytes, llc, count)
        compute = math.ceil(count / cus) * tile_flops / cu_rate
        stages.append(GemmStage(count, compute, reads, out_bytes_stage, bw))
        prev_rows, prev_cols = rows, cols
    flops = 2.0 * m * n * k * batch
    return GemmCost(m, n, k, batch, flops, spec.kernel_launch_s, tuple(stages))


def _stage_panels(first: int, count: int, per_gemm: int, tiles_n: int
                  ) -> tuple[set[int], set[int]]:
    """Panels (A tile-rows, B tile-columns) touched by a stage, keyed across batch members."""
    rows: set[int] = set()
    cols: set[int] = set()
    pos, left = first, count
    while left > 0:
        b, local = divmod(pos, per_gemm)
        take = min(left, per_gemm - local)
        r, c = _wave_span(local, take, tiles_n)
        rows.update(b * per_gemm + i for i in r)
        cols.update(b * per_gemm + j for j in c)
        pos += take
        left -= take
    return rows, cols

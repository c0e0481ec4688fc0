"""GPU GEMM cost: CTA tiles -> waves (stages) -> a roofline per wave over a K-blocked working set.

A GEMM's output C[M, N] is cut into CTA tiles; each CTA walks K in blocks of `k_block_bytes`
(thesis 2.4.1.3; NVIDIA Matrix Multiplication guide 2.1). An SM holds as many CTAs as its
shared memory takes (`pipeline_stages` K-blocks of A and B each), so the GEMM runs in waves
of `compute_units * ctas_per_cu` tiles: a partial last wave under-uses the device (wave
quantization, guide 3.2) and ragged edges compute whole tiles (tile quantization, 3.1).

A wave costs max(math, operand feed from L2, DRAM) plus a fixed pipeline fill / epilogue
drain. Math runs at `efficiency` of the matrix peak (fp16 / bf16 / tf32 tensor cores) or at
`simt_efficiency` of the CUDA-core peak (fp32 / fp64). DRAM reads are K-blocked: the CTAs of a
wave advance through K together, so at any moment the wave holds a few K-blocks of its panels
and every A row-panel and B column-panel it touches is read from DRAM once per wave; a panel
of the previous wave is reused only when the whole (K-long) panels of both waves fit in the
LLC. DRAM bytes move at the device's achievable streaming rate (`DeviceSpec.dram_stream_bw`),
as every memory-bound kernel's do: the store-bound attention BMMs timed on an H100 run at
about that rate, not at the peak (results/kernels/, "Measured here"). The layout (NN, TN,
NT) does not change the cost of aligned tensor-core GEMMs (cuBLAS
has kernels for every layout); what a transposed call changes is M and N, which the caller
states. The cheapest (tile, split-K) is chosen, as cuBLAS's heuristic intends.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Iterator, NamedTuple

from .specs import MATRIX_DTYPES, DeviceSpec, GemmTiling

LAYOUTS = ("NN", "TN", "NT", "TT")
PARTIAL_BYTES = 4            # split-K partial sums are kept in fp32
TIE = 0.01                   # a smaller tile or more splits must win by 1% (library bias
                             # toward large tiles and no split: fewer kernels, fewer partials)
FLOOR_SLACK = 1e-9           # a pruning floor is lowered by this much so that its rounding
                             # (a product, not the walk's sum) never prunes a winner


class Epilogue(NamedTuple):
    """Work fused into a GEMM: per output element after the K-loop, per A element before it.

    Costs run on the CUDA cores / SFUs of the SM that owns the tile, serially with its MMA
    and its stores (the epilogue follows the K-loop and precedes the stores; a prologue
    scales A tiles before they enter it), and the one or two large-tile CTAs an SM holds
    leave nothing to hide it behind: it adds to the wave's time even when the GEMM is
    memory bound (seed 004 7.1 measures its fused MatMuls 28-55% slower).
    Extra DRAM bytes (bias, statistics, auxiliary outputs) join the waves' traffic.
    """

    out_flops: float = 0.0           # vector flops per C element
    out_sfu: float = 0.0             # special-function ops (exp) per C element
    a_flops: float = 0.0             # vector flops per A element loaded (prologue)
    extra_read_bytes: float = 0.0    # whole GEMM
    extra_write_bytes: float = 0.0


NO_EPILOGUE = Epilogue()


class GemmStage(NamedTuple):
    """One wave of CTAs: its tiles, isolated compute time and DRAM traffic.

    `serial_s`: fused epilogue / prologue work that adds to the wave rather than hiding
    behind its traffic (it runs on the tile's own warps between K-loop and stores).
    """

    tiles: int
    compute_s: float
    dram_read_bytes: float
    dram_write_bytes: float
    dram_bw: float
    serial_s: float = 0.0

    @property
    def memory_s(self) -> float:
        return (self.dram_read_bytes + self.dram_write_bytes) / self.dram_bw

    @property
    def time_s(self) -> float:
        return max(self.compute_s, self.memory_s) + self.serial_s

    @property
    def memory_intensity(self) -> float:
        """Fraction of the stage's time the DRAM is busy (0 = cache resident, 1 = bound)."""
        return self.memory_s / self.time_s if self.time_s > 0 else 0.0


@dataclass(frozen=True)
class GemmCost:
    """Modelled cost of C[M, N] = op(A)[M, K] @ op(B)[K, N] (optionally batched)."""

    m: int
    n: int
    k: int
    batch: int
    flops: float
    launch_s: float
    stages: tuple[GemmStage, ...]
    tile_m: int = 0
    tile_n: int = 0
    split_k: int = 1
    layout: str = "NN"

    # cached: a cost is computed once per shape (devices/cost.py) and read at every micro-batch
    @cached_property
    def time_s(self) -> float:
        return self.launch_s + sum(s.time_s for s in self.stages)

    @cached_property
    def dram_read_bytes(self) -> float:
        return sum(s.dram_read_bytes for s in self.stages)

    @cached_property
    def dram_write_bytes(self) -> float:
        return sum(s.dram_write_bytes for s in self.stages)

    @cached_property
    def dram_bytes(self) -> float:
        return self.dram_read_bytes + self.dram_write_bytes

    @property
    def n_stages(self) -> int:
        return len(self.stages)

    @property
    def tflops(self) -> float:
        return self.flops / self.time_s / 1e12


class _Shape(NamedTuple):
    """Everything the wave loop needs about one (tile, split-K) candidate."""

    m: int
    n: int
    k: int
    batch: int
    tm: int
    tn: int
    split: int
    in_bytes: int
    out_bytes: int
    epi: Epilogue

    @property
    def tiles_m(self) -> int:
        return math.ceil(self.m / self.tm)

    @property
    def tiles_n(self) -> int:
        return math.ceil(self.n / self.tn)

    @property
    def k_part(self) -> int:
        return math.ceil(self.k / self.split)

    @property
    def per_gemm(self) -> int:
        """CTAs per batch member: output tiles x K splits (split-major raster)."""
        return self.tiles_m * self.tiles_n * self.split


def candidate_tiles(g: GemmTiling) -> list[tuple[int, int]]:
    """CTA tiles the library may pick (cuBLAS set: powers of two, aspect <= 2)."""
    top, area = g.largest_side, g.tile_m * g.tile_n
    low = g.tile_min or min(g.tile_m, g.tile_n)
    sides = [s for s in (2 ** i for i in range(3, 12)) if low <= s <= top]
    out = [(a, b) for a in sides for b in sides
           if a * b <= area and max(a, b) <= 2 * min(a, b)]
    return out or [(g.tile_m, g.tile_n)]


def ctas_per_cu(g: GemmTiling, tm: int, tn: int, in_bytes: int) -> int:
    """CTAs an SM holds: shared memory for the K-block pipeline, capped by occupancy."""
    cap = max(1, g.wgs_per_cu * g.tile_m * g.tile_n // (tm * tn))
    smem = g.pipeline_stages * (tm + tn) * g.k_block_bytes
    fit = g.smem_per_cu_bytes // smem if math.isfinite(g.smem_per_cu_bytes) else cap
    return int(max(1, min(cap, fit)))


def swizzle_width(wave: int, tiles_n: int, swizzle: int = 1) -> int:
    """Tile columns per raster band: the power of two nearest sqrt(wave), so a wave covers a
    squarish block of C (CUTLASS threadblock swizzle); all columns for row-major order."""
    if not swizzle:
        return tiles_n
    width = 2 ** max(0, round(math.log2(max(1.0, math.sqrt(wave)))))
    return max(1, min(width, tiles_n))


def _wave_span(first: int, count: int, tiles_m: int, tiles_n: int, width: int,
               rows: set[int], cols: set[int], row0: int, col0: int) -> None:
    """Add to `rows` / `cols` (numbered from `row0` / `col0`) the tile rows and columns that
    tiles [first, first+count) of one K split touch, walked in bands of `width` columns,
    each band row by row (the last band may be narrower)."""
    band_tiles = tiles_m * width
    t, end = first, first + count
    while t < end:
        band, rest = divmod(t, band_tiles)
        c0 = band * width
        w = min(width, tiles_n - c0)
        take = min(end - t, tiles_m * w - rest)
        r0, r1 = rest // w, (rest + take - 1) // w
        rows.update(range(row0 + r0, row0 + r1 + 1))
        if r1 > r0:
            cols.update(range(col0 + c0, col0 + c0 + w))
        else:
            cols.update(range(col0 + c0 + rest % w, col0 + c0 + (rest + take - 1) % w + 1))
        t += take


def _stage_panels(first: int, count: int, sh: _Shape, width: int
                  ) -> tuple[set[int], set[int]]:
    """Panels (A tile-rows, B tile-columns, each per K split) a wave touches, over the batch."""
    rows: set[int] = set()
    cols: set[int] = set()
    tiles_m, tiles_n, per_gemm = sh.tiles_m, sh.tiles_n, sh.per_gemm
    per_split = tiles_m * tiles_n
    pos, left = first, count
    while left > 0:
        b, local = divmod(pos, per_gemm)
        s, t = divmod(local, per_split)
        take = min(left, per_split - t)
        key = (b * sh.split + s) * (tiles_m + tiles_n)
        _wave_span(t, take, tiles_m, tiles_n, width, rows, cols, key, key + tiles_m)
        pos += take
        left -= take
    return rows, cols


def _stage_reads(rows: set[int], cols: set[int], prev_rows: set[int], prev_cols: set[int],
                 row_bytes: float, col_bytes: float, llc_bytes: float) -> float:
    """DRAM input bytes of one wave: each panel once (K-blocked), the previous wave's kept
    only if both waves' whole panels fit in the LLC."""
    union = len(rows | prev_rows) * row_bytes + len(cols | prev_cols) * col_bytes
    if union <= llc_bytes:
        return len(rows - prev_rows) * row_bytes + len(cols - prev_cols) * col_bytes
    return len(rows) * row_bytes + len(cols) * col_bytes


def _math_rate(spec: DeviceSpec, dtype: str) -> float:
    """Flop/s one SM sustains in a steady K-loop."""
    g = spec.gemm
    eff = g.efficiency if dtype in MATRIX_DTYPES else (g.simt_efficiency or g.efficiency)
    return spec.peak(dtype) * eff / spec.compute_units


class _Tiles(NamedTuple):
    """What every wave of one candidate shares: its size and each tile's costs."""

    wave: int               # CTAs per wave: compute units x CTAs each holds
    total: int              # CTAs of the whole GEMM
    out_bytes: float        # DRAM bytes a tile writes (C, or its fp32 partial)
    math_s: float           # a tile's K-loop at the SM's matrix rate
    epilogue_s: float       # a tile's fused epilogue / prologue (serial, `Epilogue`)
    feed_bytes: float       # operand bytes a tile pulls from L2

    def compute_s(self, g: GemmTiling, count: int, cus: int) -> tuple[int, float]:
        """(tiles per SM, compute time) of a wave of `count` tiles: math or L2 feed, plus
        the fixed pipeline fill / drain."""
        per_sm = math.ceil(count / cus)
        return per_sm, max(per_sm * self.math_s, count * self.feed_bytes / g.l2_bw_bytes_per_s) \
            + g.wave_fixed_s


def _tiles(spec: DeviceSpec, sh: _Shape, dtype: str, cus: int) -> _Tiles:
    return _Tiles(
        wave=cus * ctas_per_cu(spec.gemm, sh.tm, sh.tn, sh.in_bytes),
        total=sh.per_gemm * sh.batch,
        out_bytes=min(sh.tm, sh.m) * min(sh.tn, sh.n) * (
            0 if _partials_in_llc(spec, sh) else PARTIAL_BYTES if sh.split > 1
            else sh.out_bytes),
        math_s=2.0 * sh.tm * sh.tn * sh.k_part / _math_rate(spec, dtype),
        epilogue_s=_tile_epilogue_s(spec, sh),
        feed_bytes=(sh.tm + sh.tn) * sh.k_part * sh.in_bytes)


def _floor_s(spec: DeviceSpec, sh: _Shape, dtype: str, cus: int) -> float:
    """A lower bound of the candidate's wave time: every wave as `_waves` costs it but with
    no panel reads. The waves are alike but the last, so it is a product, not a walk; its
    rounding differs from the walked sum by a few ulps, which `FLOOR_SLACK` absorbs."""
    t = _tiles(spec, sh, dtype, cus)
    per_tile_bytes = t.out_bytes + (sh.epi.extra_read_bytes + sh.epi.extra_write_bytes) / t.total

    def one(count: int) -> float:
        per_sm, compute = t.compute_s(spec.gemm, count, cus)
        return max(compute, count * per_tile_bytes / spec.dram_stream_bw) \
            + per_sm * t.epilogue_s

    full, last = divmod(t.total, t.wave)
    return full * one(t.wave) + (one(last) if last else 0.0)


def _waves(spec: DeviceSpec, sh: _Shape, dtype: str, cus: int, bypass: bool
           ) -> Iterator[GemmStage]:
    """The waves of one candidate, each with the input panels it reads from DRAM."""
    t = _tiles(spec, sh, dtype, cus)
    row_bytes = min(sh.tm, sh.m) * sh.k_part * sh.in_bytes
    col_bytes = min(sh.tn, sh.n) * sh.k_part * sh.in_bytes
    extra_r, extra_w = sh.epi.extra_read_bytes / t.total, sh.epi.extra_write_bytes / t.total
    width = swizzle_width(t.wave, sh.tiles_n, spec.gemm.swizzle)
    prev_rows: set[int] = set()
    prev_cols: set[int] = set()
    for first in range(0, t.total, t.wave):
        count = min(t.wave, t.total - first)
        out_stage = count * t.out_bytes
        llc = spec.llc_bytes - (0.0 if bypass else min(out_stage, spec.llc_bytes / 2))
        rows, cols = _stage_panels(first, count, sh, width)
        reads = _stage_reads(rows, cols, prev_rows, prev_cols, row_bytes, col_bytes, llc)
        prev_rows, prev_cols = rows, cols
        per_sm, compute = t.compute_s(spec.gemm, count, cus)
        yield GemmStage(count, compute, reads + count * extra_r, out_stage + count * extra_w,
                        spec.dram_stream_bw, per_sm * t.epilogue_s)


def _tile_epilogue_s(spec: DeviceSpec, sh: _Shape) -> float:
    """Fused epilogue / prologue work of one tile on its SM's CUDA cores and SFUs."""
    e = sh.epi
    if e == NO_EPILOGUE:
        return 0.0
    vec = spec.vector_flops_per_s / spec.compute_units
    sfu = spec.sfu_ops_per_s / spec.compute_units
    return (sh.tm * sh.tn * (e.out_flops / vec + e.out_sfu / sfu)
            + sh.tm * sh.k_part * e.a_flops / vec)


def _partials_in_llc(spec: DeviceSpec, sh: _Shape) -> bool:
    """Split-K partial sums stay in the LLC (in-kernel serial reduction) when they fit."""
    return sh.split > 1 and sh.m * sh.n * sh.batch * sh.split * PARTIAL_BYTES <= spec.llc_bytes / 2


def _split_reduce(spec: DeviceSpec, sh: _Shape) -> GemmStage:
    """Summing split-K partials: every fp32 partial read once (from the LLC when they fit
    there, else from DRAM), C written once."""
    elems = sh.m * sh.n * sh.batch
    partial = elems * sh.split * PARTIAL_BYTES
    if _partials_in_llc(spec, sh):
        return GemmStage(0, partial / spec.gemm.l2_bw_bytes_per_s + spec.gemm.wave_fixed_s, 0.0,
                         elems * sh.out_bytes, spec.dram_stream_bw)
    return GemmStage(0, spec.gemm.wave_fixed_s, partial, elems * sh.out_bytes,
                     spec.dram_stream_bw)


def _candidates(spec: DeviceSpec, m: int, n: int, k: int, batch: int, in_bytes: int,
                out_bytes: int, epi: Epilogue) -> Iterator[_Shape]:
    g = spec.gemm
    k_block = max(1, g.k_block_bytes // in_bytes)
    for tm, tn in candidate_tiles(g):
        split = 1
        while split <= g.split_k_max and (split == 1 or k // split >= 4 * k_block):
            yield _Shape(m, n, k, batch, tm, tn, split, in_bytes, out_bytes, epi)
            split *= 2


def gemm_cost(spec: DeviceSpec, m: int, n: int, k: int, *, dtype: str = "fp16",
              batch: int = 1, in_bytes: int = 2, out_bytes: int = 2,
              bypass_llc_output: bool = False, compute_units: int | None = None,
              layout: str = "NN", epilogue: Epilogue = NO_EPILOGUE) -> GemmCost:
    """Stage-by-stage cost of a (batched) GEMM on a GPU, cheapest tile and split-K.

    `bypass_llc_output` models T3's uncached output writes (thesis 8.3.3): output tiles no
    longer occupy the LLC, leaving it all for input panels. `compute_units` runs the GEMM on
    fewer CUs than the device has (the rest run a communication kernel, thesis Fig. 8.4):
    smaller waves, so more stages at the same per-CU rate.
    """
    if min(m, n, k, batch) <= 0:
        raise ValueError(f"GEMM dims must be positive, got M={m} N={n} K={k} batch={batch}")
    if layout not in LAYOUTS:
        raise ValueError(f"gemm layout={layout!r}; choose one of {list(LAYOUTS)}")
    cus = spec.compute_units if compute_units is None else compute_units
    if not 0 < cus <= spec.compute_units:
        raise ValueError(f"compute_units={compute_units} must lie in [1, {spec.compute_units}]")
    shapes = list(_candidates(spec, m, n, k, batch, in_bytes, out_bytes, epilogue))
    floors = [(spec.kernel_launch_s + _floor_s(spec, sh, dtype, cus)) * (1 - FLOOR_SLACK)
              for sh in shapes]

    def walk(sh: _Shape) -> GemmCost:
        stages = tuple(_waves(spec, sh, dtype, cus, bypass_llc_output))
        if sh.split > 1:
            stages += (_split_reduce(spec, sh),)
        return GemmCost(m, n, k, batch, 2.0 * m * n * k * batch, spec.kernel_launch_s, stages,
                        sh.tm, sh.tn, sh.split, layout)

    # cuBLAS's order decides ties (TIE), so candidates are judged in order; but the one with
    # the least floor, walked first, wins its turn outright if it beats every earlier floor:
    # then the earlier candidates need no walk (each would have lost to it or been replaced)
    g = min(range(len(shapes)), key=floors.__getitem__)
    cost_g = walk(shapes[g])
    first = g if all(cost_g.time_s < f * (1 - TIE) for f in floors[:g]) else 0
    best: GemmCost | None = None
    for i in range(first, len(shapes)):
        if best is not None and floors[i] >= best.time_s * (1 - TIE):
            continue        # even its floor (no panel reads) loses: the choice is unchanged
        cost = cost_g if i == g else walk(shapes[i])
        if best is None or cost.time_s < best.time_s * (1 - TIE):
            best = cost
    assert best is not None
    return best

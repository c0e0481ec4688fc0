"""Ring schedules of the fused collectives: which rows a rank handles at each step (pure).

Rows of the [M, N] output (or of the gathered [M, K] input) are cut into P chunks with
`chunk_bounds` (longer chunks first). A lane moves data one way round the ring: d = +1 to the
next rank, d = -1 to the previous one. Bidirectional rings run two lanes at once on the low
and high halves of every chunk, exactly as `comm.ring` does, so results match it bitwise.

Reduce-scatter (thesis 8.3, Fig. 8.5; overlap_software.md 5.1): at step s rank r produces
chunk (r - d(s+1)): the chunk that leaves first comes first, its own chunk (s = P-1) last.
Chunk c is folded over ranks c+d, c+2d, ..., c. All-gather (5.2): at step s rank r holds the
shard of rank (r - d s) and forwards it.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..comm.ring import chunk_bounds

Rows = tuple[int, int]


@dataclass(frozen=True)
class Lane:
    """One direction of travel and the rows of every chunk it carries."""

    index: int
    d: int
    bounds: tuple[Rows, ...]

    @property
    def direction(self) -> str:
        return "next" if self.d == 1 else "prev"

    def peers(self, rank: int, size: int) -> tuple[int, int]:
        """(destination, source) of this lane for `rank`."""
        return (rank + self.d) % size, (rank - self.d) % size


def lanes(m: int, size: int, bidirectional: bool) -> list[Lane]:
    """Row chunks per lane; bidirectional: low halves go +1, high halves -1 (as comm.ring)."""
    whole = chunk_bounds(m, size)
    if not bidirectional:
        return [Lane(0, 1, tuple(whole))]
    mid = [lo + (hi - lo + 1) // 2 for lo, hi in whole]
    return [Lane(0, 1, tuple((lo, c) for (lo, _), c in zip(whole, mid))),
            Lane(1, -1, tuple((c, hi) for (_, hi), c in zip(whole, mid)))]


def rs_chunk(rank: int, d: int, step: int, size: int) -> int:
    """The chunk a rank produces (and reduces) at reduce-scatter step `step`."""
    return (rank - d * (step + 1)) % size


def ag_owner(rank: int, d: int, step: int, size: int) -> int:
    """Whose shard a rank holds (and consumes) at all-gather step `step`."""
    return (rank - d * step) % size


def fold_ranks(chunk: int, d: int, size: int) -> list[int]:
    """Ranks whose partials a lane sums for `chunk`, in summation order (ends with `chunk`)."""
    return [(chunk + d * (j + 1)) % size for j in range(size)]


def split(rows: Rows, parts: int) -> list[Rows]:
    """Sub-chunks of a row range: `parts` pieces, longer first (empty ones kept)."""
    lo, hi = rows
    return chunk_bounds(hi - lo, parts, lo)


@dataclass(frozen=True)
class Piece:
    """One sub-chunk message of one lane at one step, placed in the rank's execution order."""

    lane: int
    step: int
    index: int
    chunk: int
    rows: Rows
    pos0: float          # fraction of the GEMM's rows executed before this piece
    pos1: float          # ... and after it

    @property
    def n_rows(self) -> int:
        return self.rows[1] - self.rows[0]


def plan(rank: int, size: int, m: int, ls: list[Lane], parts: int, kind: str) -> list[Piece]:
    """Pieces in the order the rank's GEMM produces (rs) or consumes (ag) them."""
    pick = rs_chunk if kind == "rs" else ag_owner
    out: list[Piece] = []
    done = 0
    for step in range(size):
        for lane in ls:
            chunk = pick(rank, lane.d, step, size)
            for i, rows in enumerate(split(lane.bounds[chunk], parts)):
                n = rows[1] - rows[0]
                out.append(Piece(lane.index, step, i, chunk, rows, done / max(m, 1),
                                 (done + n) / max(m, 1)))
                done += n
    return out

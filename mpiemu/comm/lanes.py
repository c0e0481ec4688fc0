"""Ring schedules: which rows a rank handles at each step of each lane (pure, no MPI).

Rows of the data ([M, N] output of a GEMM, or a flat buffer with rows of one element) are
cut into P chunks with `chunk_bounds` (longer chunks first, as `np.array_split`); chunk c
belongs to group rank c. A *lane* is one ring: an order of the P ranks it travels and the
part of every chunk it carries. One lane is the plain ring; a bidirectional ring runs the
low half of every chunk forwards and the high half backwards (two lanes); a ring that
crosses nodes runs one lane per rail, each entering and leaving a node at a different
device, so every NIC carries a share (NCCL's channels).

Reduce-scatter (thesis 2.4.3.1; 8.3, Fig. 8.5): at step s the rank at position i of a lane
sends (or produces) the chunk of the rank at position i - s - 1, so it ends with its own
chunk, folded over the ranks after it in lane order. All-gather: at step s a rank holds the
shard of the rank at position i - s and forwards it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

Rows = tuple[int, int]


def chunk_bounds(n: int, parts: int, offset: int = 0) -> list[Rows]:
    """[lo, hi) of each of `parts` chunks of n elements, longer chunks first."""
    q, extra = divmod(n, parts)
    out, lo = [], offset
    for c in range(parts):
        hi = lo + q + (1 if c < extra else 0)
        out.append((lo, hi))
        lo = hi
    return out


@dataclass(frozen=True)
class Lane:
    """One ring: the order of group ranks it travels and the rows of every chunk it carries."""

    index: int
    order: tuple[int, ...]
    bounds: tuple[Rows, ...]              # by chunk (= owning group rank)
    _pos: dict[int, int] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self._pos.update({r: i for i, r in enumerate(self.order)})

    @property
    def size(self) -> int:
        return len(self.order)

    def _at(self, rank: int, shift: int) -> int:
        o = self.order
        return o[(self._pos[rank] + shift) % len(o)]

    def peers(self, rank: int) -> tuple[int, int]:
        """(destination, source) of this lane for `rank`."""
        return self._at(rank, 1), self._at(rank, -1)

    def rs_chunk(self, rank: int, step: int) -> int:
        """The chunk a rank sends (produces, reduces) at reduce-scatter step `step`."""
        return self._at(rank, -step - 1)

    def ag_owner(self, rank: int, step: int) -> int:
        """Whose shard a rank holds (and forwards) at all-gather step `step`."""
        return self._at(rank, -step)

    def fold_ranks(self, chunk: int) -> list[int]:
        """Ranks whose partials this lane sums for `chunk`, in summation order."""
        return [self._at(chunk, j + 1) for j in range(self.size)]


def lanes(m: int, orders: list[tuple[int, ...]]) -> list[Lane]:
    """Lanes over `orders`, each carrying its share of every chunk of m rows (the first
    lanes the larger shares: two lanes split a chunk as the bidirectional ring does)."""
    size = len(orders[0])
    whole = chunk_bounds(m, size)
    per_lane: list[list[Rows]] = [[] for _ in orders]
    for lo, hi in whole:
        for k, part in enumerate(chunk_bounds(hi - lo, len(orders), lo)):
            per_lane[k].append(part)
    return [Lane(k, o, tuple(b)) for k, (o, b) in enumerate(zip(orders, per_lane))]


def split(rows: Rows, parts: int) -> list[Rows]:
    """Sub-chunks of a row range: `parts` pieces, longer first (empty ones kept)."""
    lo, hi = rows
    return chunk_bounds(hi - lo, parts, lo)


@dataclass(frozen=True)
class Piece:
    """One timed message of one lane at one step, in the rank's execution order."""

    lane: int
    step: int
    index: int
    chunk: int
    rows: Rows
    pos0: float          # fraction of the rows handled before this piece (GEMM order)
    pos1: float          # ... and after it

    @property
    def n_rows(self) -> int:
        return self.rows[1] - self.rows[0]


def plan(rank: int, m: int, ls: list[Lane], parts: int, kind: str) -> list[Piece]:
    """Pieces in the order the rank produces (rs) or consumes (ag) them: step by step, lane
    by lane, each lane chunk cut into `parts` timed pieces."""
    out: list[Piece] = []
    done = 0
    for step in range(ls[0].size):
        for lane in ls:
            chunk = lane.rs_chunk(rank, step) if kind == "rs" else lane.ag_owner(rank, step)
            for i, rows in enumerate(split(lane.bounds[chunk], parts)):
                n = rows[1] - rows[0]
                out.append(Piece(lane.index, step, i, chunk, rows, done / max(m, 1),
                                 (done + n) / max(m, 1)))
                done += n
    return out

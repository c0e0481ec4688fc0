"""Ring schedules (comm.lanes) and the fused collectives' one-process references (no MPI)."""
from __future__ import annotations

import numpy as np
import pytest

from mpiemu.comm import lanes as sch
from mpiemu.overlap.reference import ag_gemm_reference, gemm_rs_reference, ring_lanes

SIZES = [1, 2, 3, 4, 8]
RAILS = [(0, 1, 2, 3, 4, 5), (1, 2, 0, 4, 5, 3), (2, 0, 1, 5, 3, 4)]   # 2 nodes x 3, rotated


def _orders(size: int) -> list[list[tuple[int, ...]]]:
    fwd = tuple(range(size))
    return [[fwd], [fwd, fwd[::-1]]] + ([RAILS] if size == 6 else [])


@pytest.mark.parametrize("size", [*SIZES, 6])
def test_each_rank_produces_its_own_chunk_last(size: int) -> None:
    for orders in _orders(size):
        for lane in sch.lanes(size * 3, orders):
            for r in range(size):
                assert lane.rs_chunk(r, size - 1) == r and lane.ag_owner(r, 0) == r


@pytest.mark.parametrize("size", [*SIZES, 6])
def test_the_chunk_a_rank_produces_first_is_the_one_it_sends_first(size: int) -> None:
    """Rank r starts the fold of the chunk it computes at step 0 (thesis Fig. 8.5 stagger)."""
    for orders in _orders(size):
        for lane in sch.lanes(size, orders):
            for r in range(size):
                assert lane.fold_ranks(lane.rs_chunk(r, 0))[0] == r


@pytest.mark.parametrize("size", [*SIZES, 6])
def test_a_partial_received_at_step_s_is_for_the_chunk_computed_at_step_s(size: int) -> None:
    """What the previous rank sends at step s-1 is what this rank computes at step s."""
    for orders in _orders(size):
        for lane in sch.lanes(size, orders):
            for r in range(size):
                src = lane.peers(r)[1]
                assert lane.peers(src)[0] == r
                for s in range(1, size):
                    assert lane.rs_chunk(src, s - 1) == lane.rs_chunk(r, s)


@pytest.mark.parametrize("size", [*SIZES, 6])
def test_fold_visits_every_rank_once_and_ends_at_the_owner(size: int) -> None:
    for orders in _orders(size):
        for lane in sch.lanes(size, orders):
            for c in range(size):
                order = lane.fold_ranks(c)
                assert sorted(order) == list(range(size)) and order[-1] == c


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("m", [1, 7, 37, 64])
def test_lanes_split_every_chunk_low_part_first(size: int, bidirectional: bool, m: int) -> None:
    """A chunk's lanes tile it in lane order, the first lane the longer part (as
    np.array_split), so a bidirectional ring sends the low half forwards."""
    ls = ring_lanes(m, size, bidirectional)
    for c, (lo, hi) in enumerate(sch.chunk_bounds(m, size)):
        parts = [ln.bounds[c] for ln in ls]
        assert parts[0][0] == lo and parts[-1][1] == hi
        assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
        assert parts[0][1] - parts[0][0] >= parts[-1][1] - parts[-1][0]


@pytest.mark.parametrize("kind", ["rs", "ag"])
@pytest.mark.parametrize("parts", [1, 3])
@pytest.mark.parametrize("orders", [[(0, 1, 2, 3), (3, 2, 1, 0)], [(0, 1, 2, 3), (1, 0, 3, 2)]])
def test_pieces_cover_every_row_once_in_execution_order(kind: str, parts: int,
                                                        orders: list[tuple[int, ...]]) -> None:
    m, size = 37, 4
    for r in range(size):
        pieces = sch.plan(r, m, sch.lanes(m, orders), parts, kind)
        rows = sorted(i for p in pieces for i in range(*p.rows))
        assert rows == list(range(m))
        assert all(a.pos1 == pytest.approx(b.pos0) for a, b in zip(pieces, pieces[1:]))
        assert pieces[-1].pos1 == pytest.approx(1.0)


def _operands(size: int, m: int = 37, n: int = 5, k: int = 6) -> tuple[list, list]:
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((m, k)) for _ in range(size)]
    ws = [rng.standard_normal((k, n)) for _ in range(size)]
    return xs, ws


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("fused", [False, True])
def test_rs_reference_is_the_chunked_unsharded_product(size: int, fused: bool) -> None:
    xs, ws = _operands(size)
    full = sum(x @ w for x, w in zip(xs, ws))
    got = np.concatenate(gemm_rs_reference(xs, ws, bidirectional=True, fused=fused))
    np.testing.assert_allclose(got, full, rtol=1e-12, atol=1e-12)


def test_rs_reference_folds_each_half_in_its_own_direction() -> None:
    """Exactness tier (overlap_software.md 6.3): integers sum the same in any order."""
    rng = np.random.default_rng(5)
    xs = [rng.integers(-4, 5, (37, 6)).astype(np.float64) for _ in range(4)]
    ws = [rng.integers(-4, 5, (6, 5)).astype(np.float64) for _ in range(4)]
    full = sum(x @ w for x, w in zip(xs, ws))
    for bidirectional in (False, True):
        got = np.concatenate(gemm_rs_reference(xs, ws, bidirectional=bidirectional,
                                               fused=True))
        np.testing.assert_array_equal(got, full)


@pytest.mark.parametrize("size", SIZES)
def test_ag_reference_is_the_gathered_product(size: int) -> None:
    xs, ws = _operands(size)
    shards = np.array_split(xs[0], size)
    got = ag_gemm_reference(shards, ws[0], bidirectional=True, fused=True)
    np.testing.assert_allclose(got, xs[0] @ ws[0], rtol=1e-12, atol=1e-12)

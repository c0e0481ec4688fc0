"""Ring schedules of the fused collectives and their one-process references (no MPI)."""
from __future__ import annotations

import numpy as np
import pytest

from mpiemu.comm.ring import _lanes
from mpiemu.overlap import schedule as sch
from mpiemu.overlap.reference import ag_gemm_reference, gemm_rs_reference

SIZES = [1, 2, 3, 4, 8]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("d", [1, -1])
def test_each_rank_produces_its_own_chunk_last(size: int, d: int) -> None:
    for r in range(size):
        assert sch.rs_chunk(r, d, size - 1, size) == r


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("d", [1, -1])
def test_the_chunk_a_rank_produces_first_is_the_one_it_sends_first(size: int, d: int) -> None:
    """Rank r starts the fold of the chunk it computes at step 0 (thesis Fig. 8.5 stagger)."""
    for r in range(size):
        c = sch.rs_chunk(r, d, 0, size)
        assert sch.fold_ranks(c, d, size)[0] == r


@pytest.mark.parametrize("size", SIZES)
def test_a_partial_received_at_step_s_is_for_the_chunk_computed_at_step_s(size: int) -> None:
    """What the previous rank sends at step s-1 is what this rank computes at step s."""
    for d in (1, -1):
        for r in range(size):
            src = (r - d) % size
            for s in range(1, size):
                assert sch.rs_chunk(src, d, s - 1, size) == sch.rs_chunk(r, d, s, size)


@pytest.mark.parametrize("size", SIZES)
def test_fold_visits_every_rank_once_and_ends_at_the_owner(size: int) -> None:
    for d in (1, -1):
        for c in range(size):
            order = sch.fold_ranks(c, d, size)
            assert sorted(order) == list(range(size)) and order[-1] == c


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("m", [1, 7, 37, 64])
def test_lanes_cut_rows_like_comm_ring(size: int, bidirectional: bool, m: int) -> None:
    ours = sch.lanes(m, size, bidirectional)
    theirs = _lanes(m, size, 0.0, bidirectional, 1)
    assert [(lane.d, list(lane.bounds)) for lane in ours] == [(t.d, t.bounds) for t in theirs]


@pytest.mark.parametrize("kind", ["rs", "ag"])
@pytest.mark.parametrize("parts", [1, 3])
def test_pieces_cover_every_row_once_in_execution_order(kind: str, parts: int) -> None:
    m, size = 37, 4
    for r in range(size):
        pieces = sch.plan(r, size, m, sch.lanes(m, size, True), parts, kind)
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

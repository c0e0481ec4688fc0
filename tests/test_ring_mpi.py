"""Ring RS / AG / AR equal MPI's own collectives, for any N and any length (size-agnostic)."""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from mpiemu.comm.collectives import all_gather, all_reduce, chunk_bounds, reduce_scatter
from tests.timed import reducer, timed_comm

T3 = reducer("t3-gpu")

DTYPES = [np.int32, np.int64, np.float32, np.float64]


def lengths(n: int) -> list[int]:
    """Multiples of N and not: empty chunks, one element, N-1, N, 7N+3, large odd."""
    return [1, max(n - 1, 1), n, 7 * n + 3, 1000 * n, 4099]


def data(rank: int, count: int, dtype: type) -> np.ndarray:
    rng = np.random.default_rng(1234 + rank)
    if np.issubdtype(dtype, np.integer):
        return rng.integers(-1000, 1000, count).astype(dtype)
    return rng.standard_normal(count).astype(dtype)


def check(ours: np.ndarray, ref: np.ndarray) -> None:
    if np.issubdtype(ref.dtype, np.integer):
        np.testing.assert_array_equal(ours, ref)
    else:
        np.testing.assert_allclose(ours, ref, rtol=1e-5 if ref.dtype == np.float32 else 1e-12,
                                   atol=1e-5 if ref.dtype == np.float32 else 1e-12)


@pytest.mark.mpi
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_scatter_equals_mpi(dtype: type, bidirectional: bool) -> None:
    comm = MPI.COMM_WORLD
    tc = timed_comm(comm)
    for count in lengths(comm.size):
        x = data(comm.rank, count, dtype)
        ours, _ = reduce_scatter(tc, x, reduce_s=T3, bidirectional=bidirectional)
        counts = [hi - lo for lo, hi in chunk_bounds(count, comm.size)]
        ref = np.empty(counts[comm.rank], dtype)
        comm.Reduce_scatter(x, ref, recvcounts=counts, op=MPI.SUM)
        check(ours, ref)


@pytest.mark.mpi
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_gather_equals_mpi(dtype: type, bidirectional: bool) -> None:
    comm = MPI.COMM_WORLD
    tc = timed_comm(comm)
    for count in lengths(comm.size):
        bounds = chunk_bounds(count, comm.size)
        lo, hi = bounds[comm.rank]
        mine = data(comm.rank, hi - lo, dtype)
        ours, _ = all_gather(tc, mine, total=count, bidirectional=bidirectional)
        counts = [b - a for a, b in bounds]
        ref = np.empty(count, dtype)
        comm.Allgatherv(mine, [ref, counts])
        np.testing.assert_array_equal(ours, ref)


@pytest.mark.mpi
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_reduce_equals_mpi(dtype: type, bidirectional: bool) -> None:
    comm = MPI.COMM_WORLD
    tc = timed_comm(comm)
    for count in lengths(comm.size):
        x = data(comm.rank, count, dtype)
        ours, _ = all_reduce(tc, x, reduce_s=T3, bidirectional=bidirectional)
        ref = np.empty_like(x)
        comm.Allreduce(x, ref, op=MPI.SUM)
        check(ours, ref)


@pytest.mark.mpi
def test_all_reduce_keeps_shape_and_leaves_input_alone() -> None:
    comm = MPI.COMM_WORLD
    tc = timed_comm(comm)
    x = data(comm.rank, 6 * 5, np.float64).reshape(6, 5)
    before = x.copy()
    ours, _ = all_reduce(tc, x, reduce_s=T3)
    assert ours.shape == (6, 5)
    np.testing.assert_array_equal(x, before)


@pytest.mark.mpi
def test_timing_only_collectives_match_numeric_times() -> None:
    comm = MPI.COMM_WORLD
    count = 1000 * comm.size + 7
    x = data(comm.rank, count, np.float32)
    t_real = all_reduce(timed_comm(comm), x, reduce_s=T3, wire_itemsize=2)[1]
    t_shape = all_reduce(timed_comm(comm), None, reduce_s=T3, count=count, wire_itemsize=2)[1]
    assert t_real == t_shape


@pytest.mark.mpi
@pytest.mark.parametrize("bidirectional", [False, True])
def test_two_dim_arrays_are_scattered_and_gathered_by_whole_rows(bidirectional: bool) -> None:
    comm = MPI.COMM_WORLD
    tc = timed_comm(comm)
    rows, width = 3 * comm.size + 2, 5
    x = data(comm.rank, rows * width, np.float64).reshape(rows, width)
    total = np.empty_like(x)
    comm.Allreduce(x, total)
    lo, hi = chunk_bounds(rows, comm.size)[comm.rank]
    mine, _ = reduce_scatter(tc, x, reduce_s=T3, bidirectional=bidirectional)
    assert mine.shape == (hi - lo, width)
    np.testing.assert_allclose(mine, total[lo:hi], rtol=1e-12, atol=1e-12)
    back, _ = all_gather(tc, mine, total=rows * width, bidirectional=bidirectional)
    assert back.shape == (rows, width)
    np.testing.assert_allclose(back, total, rtol=1e-12, atol=1e-12)

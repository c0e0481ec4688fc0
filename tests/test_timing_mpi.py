"""Emulated time follows the alpha-beta closed form and never breaks causality."""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from mpiemu.comm.ring import all_gather, all_reduce, reduce_scatter
from mpiemu.hw import LinkSpec
from tests.timed import timed_comm


def _alpha_beta(tc, nbytes: int, itemsize: int) -> tuple[float, float]:
    n = tc.size
    chunk = nbytes / n
    step = tc.link.latency_s + chunk / tc.link.bw_bytes_per_s
    return step, tc.reduce_s(int(chunk // itemsize), itemsize)


@pytest.mark.mpi
@pytest.mark.parametrize("nbytes", [4096, 1 << 20, 48 << 20])
def test_all_reduce_time_is_closed_form(nbytes: int) -> None:
    comm = MPI.COMM_WORLD
    tc = timed_comm(comm)
    n, itemsize = comm.size, 2
    count = nbytes // itemsize
    count -= count % n                      # S a multiple of N
    _, span = all_reduce(tc, None, count=count, wire_itemsize=itemsize)
    step, red = _alpha_beta(tc, count * itemsize, itemsize)
    assert red < step - tc.link.latency_s          # link-bound: reductions hide but the last
    expected = 2 * (n - 1) * step + (red if n > 1 else 0.0)
    assert span.duration == pytest.approx(expected, rel=1e-9, abs=0.0)


@pytest.mark.mpi
def test_rs_and_ag_times_are_closed_form() -> None:
    comm = MPI.COMM_WORLD
    tc = timed_comm(comm)
    n, count = comm.size, 3000 * comm.size
    step, red = _alpha_beta(tc, count * 4, 4)
    _, rs = reduce_scatter(tc, None, count=count, wire_itemsize=4)
    _, ag = all_gather(tc, None, total=count, after=rs.t_end, count=count // n, wire_itemsize=4)
    assert rs.duration == pytest.approx((n - 1) * step + (red if n > 1 else 0.0), rel=1e-9,
                                        abs=0.0)
    assert ag.duration == pytest.approx((n - 1) * step, rel=1e-9, abs=0.0)


@pytest.mark.mpi
def test_a_slow_reduction_stretches_every_steady_step() -> None:
    """Reduction-bound (fast link): steady steps last alpha + t_red, as the sum streams out."""
    comm = MPI.COMM_WORLD
    if comm.size < 3:
        pytest.skip("needs steady steps (N >= 3)")
    tc = timed_comm(comm, link=LinkSpec(latency_s=1e-6, bw_bytes_per_s=1e15))
    n, count = comm.size, 4096 * comm.size
    step, red = _alpha_beta(tc, count * 4, 4)
    _, rs = reduce_scatter(tc, None, count=count, wire_itemsize=4)
    expected = step + (n - 2) * (tc.link.latency_s + red) + red
    assert rs.duration == pytest.approx(expected, rel=1e-9, abs=0.0)


@pytest.mark.mpi
def test_receive_never_completes_before_send_plus_latency() -> None:
    """Ranks start at different emulated times; every receive respects its send."""
    comm = MPI.COMM_WORLD
    if comm.size == 1:
        pytest.skip("needs a peer")
    link = LinkSpec(latency_s=2e-6, bw_bytes_per_s=10e9)
    tc = timed_comm(comm, link=link)
    start = 1e-3 * ((comm.rank * 7) % comm.size)       # staggered clocks
    payload = np.full(1000, comm.rank, np.float64)
    got = np.empty_like(payload)
    rh = tc.irecv(got, tc.prev, tag=7, posted=0.0)
    sh = tc.isend(payload, tc.next, tag=7, nbytes=payload.nbytes, after=start)
    t_done = rh.wait()
    sh.wait()
    t_send = float(rh.header[0])
    sender_start = 1e-3 * ((tc.prev * 7) % comm.size)
    assert t_send == sender_start
    assert t_done >= t_send + link.latency_s
    assert t_done == pytest.approx(t_send + link.transfer_s(payload.nbytes), rel=1e-12)
    assert np.all(got == tc.prev)


@pytest.mark.mpi
def test_receive_completes_at_post_time_when_message_is_early() -> None:
    comm = MPI.COMM_WORLD
    if comm.size == 1:
        pytest.skip("needs a peer")
    tc = timed_comm(comm)
    rh = tc.irecv(None, tc.prev, tag=8, posted=5.0)
    tc.isend(None, tc.next, tag=8, nbytes=64, after=0.0).wait()
    assert rh.wait() == 5.0


@pytest.mark.mpi
def test_staggered_all_reduce_is_causal_on_every_step() -> None:
    """With staggered starts, each step's arrival is >= the sender's start plus latency."""
    comm = MPI.COMM_WORLD
    tc = timed_comm(comm)
    start = 1e-4 * comm.rank
    _, span = all_reduce(tc, None, count=4096 * comm.size, wire_itemsize=2, after=start)
    assert span.t_start == start
    latest_start = comm.allreduce(start, op=MPI.MAX)
    if comm.size > 1:     # every result holds the last starter's data: one hop at least
        assert span.t_end >= latest_start + tc.link.latency_s

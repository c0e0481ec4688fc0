"""All-to-all(v) (`comm.all_to_all`): real bytes land where NCCL's alltoallv puts them, and
emulated time follows `comm.cost.all_to_all_s`. MPI tests run at 2 and 4 ranks:

    .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py -m pytest -q -p no:cacheprovider \
        --only-mpi tests/test_all_to_all.py
"""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from mpiemu.comm.all_to_all import all_to_all_v
from mpiemu.comm.cost import Choice, all_to_all_s, estimate_s
from mpiemu.comm.folded import FoldError, FoldedComm
from mpiemu.comm.p2p import TimedComm
from mpiemu.net import Network
from mpiemu.sim.timeline import Timeline
from tests.timed import network, reducer, timed_comm

H100 = reducer("h100-sxm5")
UNIT = 3


def rows(r: int, j: int) -> int:
    """Rows rank r sends to rank j: uneven, zero for some pairs."""
    return (3 * r + 5 * j + r * j) % 4


def chunk(r: int, j: int) -> np.ndarray:
    """What rank r sends to rank j: values that name both ends and the element."""
    k = rows(r, j) * UNIT
    return (1000.0 * r + 100.0 * j + np.arange(k)).reshape(-1, UNIT)


def h100(n: int, **fields: object) -> TimedComm:
    return timed_comm(preset="h100-sxm5", net=network("dgx-h100", **fields))


@pytest.mark.mpi
def test_uneven_counts_with_zeros_land_where_alltoallv_puts_them() -> None:
    comm = MPI.COMM_WORLD
    n, me = comm.size, comm.rank
    if n not in (2, 4):
        pytest.skip("2 or 4 ranks")
    assert any(rows(r, j) == 0 for r in range(n) for j in range(n))
    tc = h100(n)
    send = [rows(me, j) for j in range(n)]
    recv = [rows(i, me) for i in range(n)]
    got, span = all_to_all_v(tc, [chunk(me, j) for j in range(n)], send, recv, itemsize=2,
                             unit=UNIT)
    for i in range(n):
        assert got[i] is not None and got[i].shape == (recv[i], UNIT)
        np.testing.assert_array_equal(got[i], chunk(i, me))
    assert span.t_end > span.t_start == 0.0


@pytest.mark.mpi
@pytest.mark.parametrize("peer_rows", [0, 1, 4096, 1 << 20])
def test_equal_counts_on_one_node_take_the_closed_form(peer_rows: int) -> None:
    """base + (n-1) b / B + a on one NVSwitch node (and `estimate_s` of the nccl-tests size
    n b gives the same)."""
    comm = MPI.COMM_WORLD
    n = comm.size
    if n < 2:
        pytest.skip("needs peers")
    tc, itemsize = h100(n), 2
    _, span = all_to_all_v(tc, None, [peer_rows] * n, [peer_rows] * n, itemsize=itemsize,
                           after=1e-3)
    b = peer_rows * itemsize
    spec = tc.net.spec
    share = spec.channel_share("simple", b * (n - 1), n)
    rate = spec.intra.bw_bytes_per_s * spec.efficiency["simple"] * share
    want = (spec.base("ring", "simple") + (n - 1) * b / rate
            + spec.intra.latency("simple") * spec.hop_scale("simple"))
    assert span.duration == pytest.approx(want, rel=1e-9, abs=0.0)
    assert all_to_all_s(tc, b) == pytest.approx(want, rel=1e-9, abs=0.0)
    est = estimate_s(tc, "all_to_all", n * b, itemsize, Choice("p2p", "simple"), H100)
    assert est == pytest.approx(want, rel=1e-9, abs=0.0)


@pytest.mark.mpi
def test_equal_counts_on_two_nodes_of_two_take_the_closed_form() -> None:
    """2 nodes x 2: the two NIC messages a rank sends and receives are serial on its NIC,
    so the busiest port's form is exact here."""
    comm = MPI.COMM_WORLD
    if comm.size != 4:
        pytest.skip("2 nodes x 2 devices")
    tc = h100(4, devices_per_node=2)
    b = 8 << 20
    _, span = all_to_all_v(tc, None, [b // 2] * 4, [b // 2] * 4, itemsize=2)
    assert span.duration == pytest.approx(all_to_all_s(tc, b), rel=1e-9, abs=0.0)


@pytest.mark.mpi
def test_the_rank_that_receives_most_ends_last() -> None:
    comm = MPI.COMM_WORLD
    n, me = comm.size, comm.rank
    if n < 2:
        pytest.skip("needs peers")
    big, small = 1 << 20, 1 << 10
    send = [big if j == 0 else small for j in range(n)]       # everyone floods rank 0
    recv = [(big if me == 0 else small) for _ in range(n)]
    _, span = all_to_all_v(h100(n), None, send, recv, itemsize=2)
    ends = comm.allgather(span.t_end)
    assert int(np.argmax(ends)) == 0
    assert all(ends[0] > e for e in ends[1:])


@pytest.mark.mpi
def test_timing_only_is_bit_identical_to_numerics_on() -> None:
    comm = MPI.COMM_WORLD
    n, me = comm.size, comm.rank
    if n < 2:
        pytest.skip("needs peers")
    send = [rows(me, j) * 1000 for j in range(n)]
    recv = [rows(i, me) * 1000 for i in range(n)]
    chunks = [np.zeros((c, UNIT), np.float32) for c in send]
    spans = []
    for data in (chunks, None):
        tc = h100(n)
        t = 0.0
        for k in range(3):                   # back-to-back calls share the ports
            _, sp = all_to_all_v(tc, data, send, recv, itemsize=2, unit=UNIT, after=t)
            t = sp.t_end
            spans.append(sp)
    assert spans[:3] == spans[3:]


def test_one_rank_copies_its_chunk_at_no_time() -> None:
    tc = timed_comm(MPI.COMM_SELF, preset="h100-sxm5")
    x = np.arange(6.0).reshape(2, 3)
    got, span = all_to_all_v(tc, [x], [2], [2], itemsize=4, unit=3, after=5e-6)
    assert span == (5e-6, 5e-6)
    assert got[0] is not None and got[0] is not x
    np.testing.assert_array_equal(got[0], x)
    assert all_to_all_v(tc, None, [2], [2], itemsize=4)[0] == [None]


def _folded(n: int) -> TimedComm:
    """Rank 0 of a folded group of n on one DGX H100 node (its members are images)."""
    devices = list(range(n))
    return TimedComm(FoldedComm.images("tp", 0, devices), Timeline(),
                     Network(network("dgx-h100"), n), "tp", devices=devices)


def test_a_folded_group_runs_equal_counts_exactly() -> None:
    tc = _folded(8)
    _, span = all_to_all_v(tc, None, [4096] * 8, [4096] * 8, itemsize=2)
    assert span.duration == pytest.approx(all_to_all_s(tc, 4096 * 2), rel=1e-9, abs=0.0)


def test_a_folded_group_refuses_uneven_counts_and_payload() -> None:
    with pytest.raises(FoldError, match="uneven counts"):
        all_to_all_v(_folded(4), None, [1, 2, 1, 1], [1, 1, 1, 1], itemsize=2)
    with pytest.raises(FoldError, match="payload"):
        all_to_all_v(_folded(4), [np.zeros(1)] * 4, [1] * 4, [1] * 4, itemsize=2)


def test_counts_and_chunks_are_checked() -> None:
    tc = _folded(4)
    with pytest.raises(ValueError, match="3 send and 4 receive"):
        all_to_all_v(tc, None, [1, 1, 1], [1] * 4, itemsize=2)
    with pytest.raises(ValueError, match="itself"):
        all_to_all_v(tc, None, [2, 1, 1, 1], [1] * 4, itemsize=2)
    with pytest.raises(ValueError, match="chunk 1"):
        all_to_all_v(tc, [np.zeros(1), np.zeros(2), np.zeros(1), np.zeros(1)], [1] * 4,
                     [1] * 4, itemsize=2)


def test_node_deltas_are_nccls_order_and_a_permutation() -> None:
    from mpiemu.comm.all_to_all import node_deltas
    assert node_deltas(1) == [0] and node_deltas(2) == [0, 1]
    assert node_deltas(4) == [0, 2, 1, 3]
    assert node_deltas(8) == [0, 4, 1, 7, 3, 5, 2, 6]
    assert all(sorted(node_deltas(k)) == list(range(k)) for k in range(1, 40))


def test_rounds_go_node_by_node_and_pair_each_send_with_a_receive() -> None:
    from mpiemu.comm.all_to_all import rounds
    devices = [0, 1, 2, 3]
    tc = TimedComm(FoldedComm.images("dp", 0, devices), Timeline(),
                   Network(network("dgx-h100", devices_per_node=2), 4), "dp", devices=devices)
    assert rounds(tc) == [(-1, -1), (1, 1), (2, 2), (3, 3)]
    one = _folded(4)                          # one node: (rank + s), (rank - s)
    assert rounds(one) == [(-1, -1), (1, 3), (2, 2), (3, 1)]


def test_the_docs_quote_the_reports_all_to_all_headline() -> None:
    """docs/network.md's all-to-all headline is the report's sentence over the committed
    comparison (`mpiemu report collectives` rewrites it), not typed."""
    from mpiemu.studies.collectives import setups
    from mpiemu.studies.collectives_all_to_all import doc_headline, headline
    from mpiemu.studies.common import ROOT, read_csv
    cmp = read_csv(ROOT / "results" / "collectives" / "comparison.csv")
    assert any(r["op"] == "all_to_all" for r in cmp)
    assert doc_headline() == headline(cmp, setups())

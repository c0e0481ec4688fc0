"""Emulated time follows the documented closed forms (comm.cost) and never breaks causality."""
from __future__ import annotations

import math

import numpy as np
import pytest
from mpi4py import MPI

from mpiemu.comm.collectives import all_gather, all_reduce, call_for, reduce_scatter
from mpiemu.comm.cost import Choice, estimate_s, ring_steps_s
from mpiemu.comm.p2p import TimedComm
from mpiemu.comm.ring import Reduction
from tests.timed import network, reducer, timed_comm

T3, A100 = reducer("t3-gpu"), reducer("a100-sxm4-80gb")


def _ring_form(tc: TimedComm, red_s: Reduction, op: str, nbytes: int, itemsize: int) -> float:
    """base + the one-lane ring (comm.cost docstring), from the hop to the next rank."""
    if tc.size == 1:
        return 0.0
    call = call_for(tc, op, nbytes, itemsize)[1]
    c = math.ceil(nbytes / itemsize / tc.size) * itemsize
    red = red_s(c // itemsize, itemsize)
    return tc.net.spec.base("ring", call.protocol) + ring_steps_s(
        tc.size, c, tc.rate(tc.next, call), tc.latency(tc.next, call), red, op)


def _check_all_three(tc: TimedComm, red_s: Reduction, count: int, itemsize: int) -> None:
    """`tc` is tuned to the ring (NCCL's tuner takes the tree across nodes) and one
    protocol for the three calls."""
    assert tc.tuning.algorithm == "ring" and tc.tuning.protocol
    _, rs = reduce_scatter(tc, None, reduce_s=red_s, count=count, wire_itemsize=itemsize)
    _, ag = all_gather(tc, None, total=count, after=rs.t_end, count=count // tc.size,
                       wire_itemsize=itemsize)
    _, ar = all_reduce(tc, None, reduce_s=red_s, count=count, wire_itemsize=itemsize,
                       after=ag.t_end)
    for op, span in (("reduce_scatter", rs), ("all_gather", ag), ("all_reduce", ar)):
        want = _ring_form(tc, red_s, op, count * itemsize, itemsize)
        assert span.duration == pytest.approx(want, rel=1e-9, abs=0.0), op
        if tc.size > 1:
            est = estimate_s(tc, op, count * itemsize, itemsize,
                             Choice("ring", tc.tuning.protocol), red_s)
            assert est == pytest.approx(want, rel=1e-9, abs=0.0), op


@pytest.mark.mpi
@pytest.mark.parametrize("nbytes", [4096, 1 << 20, 48 << 20])
def test_ring_topology_time_is_closed_form(nbytes: int) -> None:
    """The T3 study's ring: 2(N-1)(a + S/(N B)) + t_red for an all-reduce, no base."""
    tc = timed_comm(algorithm="ring", protocol="simple")
    n, itemsize = tc.size, 2
    count = nbytes // itemsize // n * n
    _check_all_three(tc, T3, count, itemsize)


@pytest.mark.mpi
@pytest.mark.parametrize("preset", ["dgx-a100", "dgx1-v100", "pcie-gen4"])
@pytest.mark.parametrize("proto", ["ll", "ll128", "simple"])
def test_switch_and_mesh_times_are_closed_form_per_protocol(preset: str, proto: str) -> None:
    """One node of a switch (NVSwitch, PCIe) or a mesh: base(p) + steps at rate x eff(p)."""
    tc = timed_comm(preset="a100-sxm4-80gb", net=network(preset), algorithm="ring",
                    protocol=proto)
    if proto not in tc.net.spec.protocols:
        pytest.skip(f"{preset} has no {proto}")
    _check_all_three(tc, A100, 3000 * tc.size, 2)
    assert call_for(tc, "all_reduce", 6000 * tc.size, 2)[1].protocol == proto


@pytest.mark.mpi
def test_one_device_per_node_rides_the_nics() -> None:
    """Hierarchical network, one rank per node: every hop is a NIC hop (inter rate, latency)."""
    tc = timed_comm(preset="a100-sxm4-80gb", net=network("dgx-a100", devices_per_node=1),
                    algorithm="ring", protocol="simple")
    if tc.size == 1:
        pytest.skip("needs two nodes")
    assert tc.net.hop(0, 1).inter_node
    assert tc.rate(tc.next) == 25e9                 # HDR NIC, Simple, every channel
    _check_all_three(tc, A100, 4096 * tc.size, 2)


@pytest.mark.mpi
def test_hierarchical_all_reduce_is_its_three_rings() -> None:
    """2 devices per node: intra RS (S) + rail AR (S/2) + intra AG (S), one base latency."""
    comm = MPI.COMM_WORLD
    if comm.size != 4:
        pytest.skip("2 nodes x 2 devices")
    tc = timed_comm(preset="a100-sxm4-80gb", net=network("dgx-a100", devices_per_node=2),
                    algorithm="hierarchical", protocol="simple")
    count, itemsize = 1 << 19, 2              # 1 MiB: one segment (pipeline_depth)
    _, span = all_reduce(tc, None, reduce_s=A100, count=count, wire_itemsize=itemsize)
    intra, rail = tc.split("node", lambda r: r // 2), tc.split("rail", lambda r: r % 2)
    s = count * itemsize
    ring = call_for(tc, "all_reduce", s, itemsize)[1]._replace(algorithm="ring")
    c = s // 2
    red = A100(c // itemsize, itemsize)
    red_rail = A100(c // 2 // itemsize, itemsize)
    nv = intra.rate(intra.next, ring), intra.latency(intra.next, ring)
    ib = rail.rate(rail.next, ring), rail.latency(rail.next, ring)
    want = (tc.net.spec.base("hierarchical", "simple")
            + ring_steps_s(2, c, *nv, red, "reduce_scatter")
            + ring_steps_s(2, c // 2, *ib, red_rail, "all_reduce")
            + ring_steps_s(2, c, *nv, 0.0, "all_gather"))
    assert span.duration == pytest.approx(want, rel=1e-9, abs=0.0)
    est = estimate_s(tc, "all_reduce", s, itemsize, Choice("hierarchical", "simple"), A100)
    assert est == pytest.approx(want, rel=1e-9, abs=0.0)


@pytest.mark.mpi
def test_pipelined_hierarchical_all_reduce_overlaps_nvlink_and_nics() -> None:
    """8 segments: faster than the three phases one after the other, no faster than the
    busiest port allows; and the 2 x 2 all-reduce is bounded by its NIC hop."""
    comm = MPI.COMM_WORLD
    if comm.size != 4:
        pytest.skip("2 nodes x 2 devices")
    net = network("dgx-a100", devices_per_node=2)
    count, itemsize = 1 << 24, 2                                    # 32 MiB: 8 segments
    times = {}
    for algo in ("hierarchical", "ring"):
        tc = timed_comm(preset="a100-sxm4-80gb", net=net, algorithm=algo, protocol="simple")
        times[algo] = all_reduce(tc, None, reduce_s=A100, count=count,
                                 wire_itemsize=itemsize)[1].duration
    s = count * itemsize
    nic = s / 2 / 25e9                # the rail all-reduce of S/2 over 2 nodes, per NIC
    nvlink = 2 * (s / 2) / 240e9      # intra RS + AG, S/2 each way, one NVSwitch port
    assert max(nic, nvlink) < times["hierarchical"] < nic + nvlink + 1e-4
    assert times["ring"] > nic        # the ring's NIC hops carry more


@pytest.mark.mpi
def test_reduce_scatter_reduction_stretches_every_steady_step() -> None:
    """Reduction-bound (fast link): steady steps last a + t_red, as the sum streams out."""
    comm = MPI.COMM_WORLD
    if comm.size < 3:
        pytest.skip("needs steady steps (N >= 3)")
    tc = timed_comm(net=network(bw=1e15, latency=1e-6))
    n, count = comm.size, 4096 * comm.size
    _, rs = reduce_scatter(tc, None, reduce_s=T3, count=count, wire_itemsize=4)
    red = T3(count // n, 4)
    step = 1e-6 + count // n * 4 / 1e15
    assert rs.duration == pytest.approx(step + (n - 2) * (1e-6 + red) + red, rel=1e-9, abs=0.0)


@pytest.mark.mpi
def test_bidirectional_ring_on_a_switch_cannot_exceed_the_port() -> None:
    """Both lanes leave through one NVSwitch port: bus bandwidth <= the port's rate; on a
    mesh each direction has its own link and the bidirectional ring goes faster."""
    comm = MPI.COMM_WORLD
    if comm.size < 3:
        pytest.skip("a bidirectional ring needs distinct neighbours")
    count, itemsize = 1 << 22, 2
    for preset, faster in (("dgx-a100", False), ("dgx1-v100", True)):
        times = []
        for bidir in (False, True):
            tc = timed_comm(net=network(preset, base_latency_s={}), protocol="simple")
            _, span = all_reduce(tc, None, reduce_s=T3, count=count, wire_itemsize=itemsize,
                                 bidirectional=bidir)
            times.append(span.duration)
            bus = 2 * (comm.size - 1) / comm.size * count * itemsize / span.duration
            call = call_for(tc, "all_reduce", count * itemsize, itemsize, bidir)[1]
            assert bus <= tc.rate(tc.next, call) * (1 + 1e-9) * (2 if faster else 1)
        assert (times[1] < 0.6 * times[0]) == faster


@pytest.mark.mpi
def test_receive_never_completes_before_send_plus_latency() -> None:
    """Ranks start at different emulated times; every receive respects its send."""
    comm = MPI.COMM_WORLD
    if comm.size == 1:
        pytest.skip("needs a peer")
    tc = timed_comm(net=network(bw=10e9, latency=2e-6))
    start = 1e-3 * ((comm.rank * 7) % comm.size)       # staggered clocks
    payload = np.full(1000, comm.rank, np.float64)
    got = np.empty_like(payload)
    rh = tc.irecv(got, tc.prev, tag=7, posted=0.0)
    sh = tc.isend(payload, tc.next, tag=7, nbytes=payload.nbytes, after=start)
    t_done = rh.wait()
    sh.wait()
    t_send = float(rh.header[0])
    assert t_send == 1e-3 * ((tc.prev * 7) % comm.size)
    assert t_done == pytest.approx(t_send + 2e-6 + payload.nbytes / 10e9, rel=1e-12)
    assert np.all(got == tc.prev)


@pytest.mark.mpi
def test_receive_completes_at_post_time_when_message_is_early() -> None:
    comm = MPI.COMM_WORLD
    if comm.size == 1:
        pytest.skip("needs a peer")
    tc = timed_comm()
    rh = tc.irecv(None, tc.prev, tag=8, posted=5.0)
    tc.isend(None, tc.next, tag=8, nbytes=64, after=0.0).wait()
    assert rh.wait() == 5.0


@pytest.mark.mpi
def test_staggered_all_reduce_is_causal_on_every_step() -> None:
    """With staggered starts, each step's arrival is >= the sender's start plus latency."""
    comm = MPI.COMM_WORLD
    tc = timed_comm()
    start = 1e-4 * comm.rank
    _, span = all_reduce(tc, None, reduce_s=T3, count=4096 * comm.size, wire_itemsize=2,
                         after=start)
    call = call_for(tc, "all_reduce", 4096 * comm.size * 2, 2)[1]
    assert span.t_start == start
    latest_start = comm.allreduce(start, op=MPI.MAX)
    if comm.size > 1:     # every result holds the last starter's data: one hop at least
        assert span.t_end >= latest_start + tc.latency(tc.next, call)

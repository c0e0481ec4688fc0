"""Every algorithm on every fabric: the payload equals MPI's own collective, and NVLS's time
equals its closed form (comm.cost)."""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from mpiemu.comm.collectives import (all_gather, all_reduce, call_for, chunk_bounds,
                                     reduce_scatter)
from tests.timed import network, reducer, timed_comm

A100, H100 = reducer("a100-sxm4-80gb"), reducer("h100-sxm5")

SETUPS = [  # (network, fields, algorithm) runnable at 4 ranks
    ("dgx-a100", {"devices_per_node": 2}, "ring"),          # two rails across 2 nodes
    ("dgx-a100", {"devices_per_node": 2}, "hierarchical"),
    ("dgx-a100", {"devices_per_node": 2}, "tree"),
    ("dgx-a100", {"devices_per_node": 1}, "tree"),
    ("dgx-h100", {}, "nvls"),
    ("dgx-h100", {"devices_per_node": 2}, "nvls_tree"),
    ("dgx1-v100", {}, "ring"),
]


@pytest.mark.mpi
@pytest.mark.parametrize("preset, fields, algo", SETUPS)
@pytest.mark.parametrize("count", [1, 1003, 1 << 20])
def test_all_reduce_equals_mpi_on_every_algorithm(preset: str, fields: dict, algo: str,
                                                  count: int) -> None:
    comm = MPI.COMM_WORLD
    if comm.size != 4:
        pytest.skip("setups are for 4 ranks")
    tc = timed_comm(preset="a100-sxm4-80gb", net=network(preset, **fields), algorithm=algo)
    x = np.random.default_rng(comm.rank).standard_normal(count)
    got, span = all_reduce(tc, x, reduce_s=A100, wire_itemsize=2)
    want = np.empty_like(x)
    comm.Allreduce(x, want)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert span.duration > 0


@pytest.mark.mpi
@pytest.mark.parametrize("count", [7, 4096 + 3])
def test_rail_lanes_scatter_and_gather_like_mpi(count: int) -> None:
    """Across 2 nodes the ring runs one lane per rail; chunks still land on their owners."""
    comm = MPI.COMM_WORLD
    if comm.size != 4:
        pytest.skip("2 nodes x 2 devices")
    tc = timed_comm(preset="a100-sxm4-80gb", net=network("dgx-a100", devices_per_node=2))
    x = np.random.default_rng(10 + comm.rank).standard_normal(count)
    bounds = chunk_bounds(count, comm.size)
    mine, _ = reduce_scatter(tc, x, reduce_s=A100, wire_itemsize=4)
    want = np.empty(bounds[comm.rank][1] - bounds[comm.rank][0])
    comm.Reduce_scatter(x, want, [hi - lo for lo, hi in bounds])
    np.testing.assert_allclose(mine, want, rtol=1e-12, atol=1e-12)
    full, _ = all_gather(tc, mine, total=count, wire_itemsize=4)
    every = np.empty(count)
    comm.Allreduce(x, every)
    np.testing.assert_allclose(full, every, rtol=1e-12, atol=1e-12)


@pytest.mark.mpi
def test_nvls_time_is_its_closed_form() -> None:
    """base(nvls) + S (N+1)/N / (B x e_nvls): both ports busy at once."""
    comm = MPI.COMM_WORLD
    if comm.size < 3:
        pytest.skip("NVLS needs more than 2 GPUs")
    tc = timed_comm(preset="h100-sxm5", net=network("dgx-h100"), algorithm="nvls")
    count, itemsize = 1 << 22, 2
    _, span = all_reduce(tc, None, reduce_s=H100, count=count, wire_itemsize=itemsize)
    spec, n, s = tc.net.spec, comm.size, count * itemsize
    want = spec.base("nvls", "simple") + s * (n + 1) / n / (
        spec.intra.bw_bytes_per_s * spec.nvls_efficiency)
    assert span.duration == pytest.approx(want, rel=1e-9, abs=0.0)
    assert call_for(tc, "all_reduce", count * itemsize, itemsize)[1].protocol == "simple"


@pytest.mark.mpi
def test_nvls_tree_time_is_its_closed_form_on_two_nodes() -> None:
    """2 nodes x 2 devices, one segment: base(nvls) + the segment out through the switch
    (S / B') + the rail tree on the shard h = S/2 (2 (h/2 / B + a) + t_red(h/2)) + the result
    back in (S / B'), B' = port rate x the NVLS efficiency."""
    comm = MPI.COMM_WORLD
    if comm.size != 4:
        pytest.skip("2 nodes x 2 devices")
    tc = timed_comm(preset="h100-sxm5", net=network("dgx-h100", devices_per_node=2),
                    algorithm="nvls_tree")
    count, itemsize = 1 << 18, 2                       # 512 KiB: one segment per shard
    _, span = all_reduce(tc, None, reduce_s=H100, count=count, wire_itemsize=itemsize)
    spec, s = tc.net.spec, count * itemsize
    b_sw = spec.intra.bw_bytes_per_s * spec.nvls_efficiency
    rail = tc.split("rail", lambda r: r % 2)
    on_rail = call_for(tc, "all_reduce", s, itemsize)[1]._replace(algorithm="ring")
    h = count // 2
    want = (spec.base("nvls_tree", "simple") + 2 * s / b_sw
            + 2 * (h // 2 * itemsize / rail.rate(rail.next, on_rail)
                   + rail.latency(rail.next, on_rail))
            + H100(h // 2, itemsize))
    assert span.duration == pytest.approx(want, rel=1e-9, abs=0.0)
    from mpiemu.comm.cost import Choice, estimate_s
    est = estimate_s(tc, "all_reduce", s, itemsize, Choice("nvls_tree", "simple"), H100)
    assert est == pytest.approx(want, rel=1e-9, abs=0.0)


@pytest.mark.mpi
def test_tree_time_is_its_closed_form_on_two_nodes() -> None:
    """One device per node, two nodes, one segment: 2 (h/B + a) + t_red(h), h = S/2."""
    comm = MPI.COMM_WORLD
    if comm.size != 2:
        pytest.skip("two nodes of one device")
    tc = timed_comm(preset="a100-sxm4-80gb", net=network("dgx-a100", devices_per_node=1),
                    algorithm="tree", protocol="simple")
    count, itemsize = 1 << 18, 2                                    # 512 KiB: one segment
    _, span = all_reduce(tc, None, reduce_s=A100, count=count, wire_itemsize=itemsize)
    call = call_for(tc, "all_reduce", count * itemsize, itemsize)[1]
    h = count // 2
    want = (tc.net.spec.base("tree", "simple") + 2 * (h * itemsize / tc.rate(tc.next, call)
                                                      + tc.latency(tc.next, call))
            + A100(h, itemsize))
    assert span.duration == pytest.approx(want, rel=1e-9, abs=0.0)
    from mpiemu.comm.cost import Choice, estimate_s
    est = estimate_s(tc, "all_reduce", count * itemsize, itemsize, Choice("tree", "simple"),
                     A100)
    assert est == pytest.approx(want, rel=1e-9, abs=0.0)


@pytest.mark.mpi
def test_nvls_waits_for_the_last_member() -> None:
    """The switch cannot hand out a sum before every member's data is in: a member that
    enters late delays every member's result by as much."""
    comm = MPI.COMM_WORLD
    if comm.size < 3:
        pytest.skip("NVLS needs more than 2 GPUs")
    tc = timed_comm(preset="h100-sxm5", net=network("dgx-h100"), algorithm="nvls")
    late = 1e-3
    after = late if comm.rank == comm.size - 1 else 0.0
    _, span = all_reduce(tc, None, reduce_s=H100, after=after, count=1 << 20, wire_itemsize=2)
    ref = timed_comm(preset="h100-sxm5", net=network("dgx-h100"), algorithm="nvls")
    _, alone = all_reduce(ref, None, reduce_s=H100, count=1 << 20, wire_itemsize=2)
    assert span.t_end == pytest.approx(late + alone.duration, rel=1e-12, abs=0.0)


@pytest.mark.mpi
def test_sequential_row_parallel_all_reduce_runs_what_nccl_chooses() -> None:
    """Without overlap, the GEMM's all-reduce is the collective the tuner picks or the
    config names (here NVLS, on an NVSwitch H100 node), timed as the plain all-reduce of
    the same size; before, it was always a ring."""
    from mpiemu.devices import device_cost, load_device
    from mpiemu.overlap.api import GemmShape, gemm_then_reduce
    comm = MPI.COMM_WORLD
    if comm.size < 3:
        pytest.skip("NVLS needs more than 2 GPUs")
    m, n, k = 2048, 1024, 512
    tc = timed_comm(preset="h100-sxm5", net=network("dgx-h100"),
                    algorithm="nvls")                     # [collectives] algorithm
    cost = device_cost(load_device("h100-sxm5"))
    x = np.random.default_rng(comm.rank).standard_normal((m, k))
    w = np.random.default_rng(100 + comm.rank).standard_normal((k, n))
    y, span = gemm_then_reduce(tc, x, w, cost=cost, shape=GemmShape(m, n, k),
                               mode="all_reduce", dtype="fp16", after=0.0)
    want = np.empty((m, n))
    comm.Allreduce(x @ w, want)
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)
    gemm = cost.gemm(m, n, k, dtype="fp16").time_s
    ref = timed_comm(preset="h100-sxm5", net=network("dgx-h100"), algorithm="nvls")
    _, ar = all_reduce(ref, None, reduce_s=cost.reduction_s, after=gemm, count=m * n,
                       wire_itemsize=2)
    assert call_for(tc, "all_reduce", m * n * 2, 2)[0].algorithm == "nvls"
    assert span.t_end == pytest.approx(ar.t_end, rel=1e-12, abs=0.0)

"""Every algorithm on every fabric: the payload equals MPI's own collective, and NVLS's time
equals its closed form (comm.cost)."""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from mpiemu.comm.collectives import all_gather, all_reduce, chunk_bounds, reduce_scatter
from tests.timed import network, timed_comm

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
    tc = timed_comm(preset="a100-sxm4-80gb", net=network(preset, **fields))
    tc.algorithm = algo
    x = np.random.default_rng(comm.rank).standard_normal(count)
    got, span = all_reduce(tc, x, wire_itemsize=2)
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
    mine, _ = reduce_scatter(tc, x, wire_itemsize=4)
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
    tc = timed_comm(preset="h100-sxm5", net=network("dgx-h100"))
    tc.algorithm = "nvls"
    count, itemsize = 1 << 22, 2
    _, span = all_reduce(tc, None, count=count, wire_itemsize=itemsize)
    spec, n, s = tc.net.spec, comm.size, count * itemsize
    want = spec.base("nvls", "simple") + s * (n + 1) / n / (
        spec.intra.bw_bytes_per_s * spec.nvls_efficiency)
    assert span.duration == pytest.approx(want, rel=1e-9, abs=0.0)
    assert tc.proto == "simple"


@pytest.mark.mpi
def test_nvls_tree_time_is_its_closed_form_on_two_nodes() -> None:
    """2 nodes x 2 devices, one segment: base(nvls) + the segment out through the switch
    (S / B') + the rail tree on the shard h = S/2 (2 (h/2 / B + a) + t_red(h/2)) + the result
    back in (S / B'), B' = port rate x the NVLS efficiency."""
    comm = MPI.COMM_WORLD
    if comm.size != 4:
        pytest.skip("2 nodes x 2 devices")
    tc = timed_comm(preset="h100-sxm5", net=network("dgx-h100", devices_per_node=2))
    tc.algorithm = "nvls_tree"
    count, itemsize = 1 << 18, 2                       # 512 KiB: one segment per shard
    _, span = all_reduce(tc, None, count=count, wire_itemsize=itemsize)
    spec, s = tc.net.spec, count * itemsize
    b_sw = spec.intra.bw_bytes_per_s * spec.nvls_efficiency
    rail = tc.split("rail", tc.rank % 2)
    h = count // 2
    want = (spec.base("nvls_tree", "simple") + 2 * s / b_sw
            + 2 * (h // 2 * itemsize / rail.rate(rail.next) + rail.latency(rail.next))
            + tc.reduce_s(h // 2, itemsize))
    assert span.duration == pytest.approx(want, rel=1e-9, abs=0.0)
    from mpiemu.comm.cost import Choice, estimate_s
    est = estimate_s(tc, "all_reduce", s, itemsize, Choice("nvls_tree", "simple"))
    assert est == pytest.approx(want, rel=1e-9, abs=0.0)


@pytest.mark.mpi
def test_tree_time_is_its_closed_form_on_two_nodes() -> None:
    """One device per node, two nodes, one segment: 2 (h/B + a) + t_red(h), h = S/2."""
    comm = MPI.COMM_WORLD
    if comm.size != 2:
        pytest.skip("two nodes of one device")
    tc = timed_comm(preset="a100-sxm4-80gb", net=network("dgx-a100", devices_per_node=1))
    tc.algorithm, tc.protocol = "tree", "simple"
    count, itemsize = 1 << 18, 2                                    # 512 KiB: one segment
    _, span = all_reduce(tc, None, count=count, wire_itemsize=itemsize)
    h = count // 2
    want = (tc.net.spec.base("tree", "simple") + 2 * (h * itemsize / tc.rate(tc.next)
                                                      + tc.latency(tc.next))
            + tc.reduce_s(h, itemsize))
    assert span.duration == pytest.approx(want, rel=1e-9, abs=0.0)
    from mpiemu.comm.cost import Choice, estimate_s
    est = estimate_s(tc, "all_reduce", count * itemsize, itemsize, Choice("tree", "simple"))
    assert est == pytest.approx(want, rel=1e-9, abs=0.0)


@pytest.mark.mpi
def test_nvls_waits_for_the_last_member() -> None:
    """The switch cannot hand out a sum before every member's data is in: a member that
    enters late delays every member's result by as much."""
    comm = MPI.COMM_WORLD
    if comm.size < 3:
        pytest.skip("NVLS needs more than 2 GPUs")
    tc = timed_comm(preset="h100-sxm5", net=network("dgx-h100"))
    tc.algorithm = "nvls"
    late = 1e-3
    after = late if comm.rank == comm.size - 1 else 0.0
    _, span = all_reduce(tc, None, after=after, count=1 << 20, wire_itemsize=2)
    ref = timed_comm(preset="h100-sxm5", net=network("dgx-h100"))
    ref.algorithm = "nvls"
    _, alone = all_reduce(ref, None, count=1 << 20, wire_itemsize=2)
    assert span.t_end == pytest.approx(late + alone.duration, rel=1e-12, abs=0.0)


@pytest.mark.mpi
def test_sequential_row_parallel_all_reduce_runs_what_nccl_chooses() -> None:
    """Without overlap, the GEMM's all-reduce is the collective the tuner picks or the
    config names (here NVLS, on an NVSwitch H100 node), timed as the plain all-reduce of
    the same size; before, it was always a ring."""
    from mpiemu.overlap.api import GemmShape, gemm_then_reduce
    comm = MPI.COMM_WORLD
    if comm.size < 3:
        pytest.skip("NVLS needs more than 2 GPUs")
    m, n, k = 2048, 1024, 512
    tc = timed_comm(preset="h100-sxm5", net=network("dgx-h100"))
    tc.algorithm = "nvls"                                 # [collectives] algorithm
    x = np.random.default_rng(comm.rank).standard_normal((m, k))
    w = np.random.default_rng(100 + comm.rank).standard_normal((k, n))
    y, span = gemm_then_reduce(tc, x, w, shape=GemmShape(m, n, k), mode="all_reduce",
                               dtype="fp16", after=0.0)
    want = np.empty((m, n))
    comm.Allreduce(x @ w, want)
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)
    gemm = tc.model.gemm(m, n, k, dtype="fp16").time_s
    ref = timed_comm(preset="h100-sxm5", net=network("dgx-h100"))
    ref.algorithm = "nvls"
    _, ar = all_reduce(ref, None, after=gemm, count=m * n, wire_itemsize=2)
    assert (tc.algo, ref.algo) == ("nvls", "nvls")
    assert span.t_end == pytest.approx(ar.t_end, rel=1e-12, abs=0.0)

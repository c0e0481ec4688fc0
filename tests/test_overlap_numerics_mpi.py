"""Fused GEMM -> RS and AG -> GEMM on real data: bitwise equal to the order-matched reference.

Size-agnostic: each test runs on sub-communicators of N in {2, 3, 4, 8} ranks (those that fit
in the job). The device has 8x8 tiles on 4 CUs, so the 37 x 11 output runs in 3 stages and
37 divides neither N nor the stage count; sw-overlap gives one of the 4 CUs to the ring.
"""
from __future__ import annotations

import dataclasses
from typing import Iterator

import numpy as np
import pytest
from mpi4py import MPI

from mpiemu.net import Network, load_network
from mpiemu.comm.p2p import TimedComm
from mpiemu.comm.lanes import chunk_bounds
from mpiemu.devices import DeviceCost, device_cost, load_device
from mpiemu.overlap.api import GemmShape, gather_then_gemm, gemm_then_reduce
from mpiemu.overlap.reference import ag_gemm_reference, gemm_rs_reference
from mpiemu.overlap.strategy import STRATEGIES, Overlap
from mpiemu.sim.timeline import Timeline

GROUPS = [2, 3, 4, 8]
M, N, K = 37, 11, 6
FUSED = ["sw-overlap", "t3", "t3-mca"]


def small_tiles() -> DeviceCost:
    """t3-gpu with 8x8 tiles on 4 CUs: a few dozen rows already take several stages."""
    spec = load_device("t3-gpu")
    return device_cost(dataclasses.replace(spec, compute_units=4, gemm=dataclasses.replace(
        spec.gemm, tile_m=8, tile_n=8, tile_min=8, wgs_per_cu=1)))


SMALL = small_tiles()


def small_tiles_comm(comm: MPI.Comm) -> TimedComm:
    """A TP communicator on t3-gpu's network, fresh timeline (its device: SMALL)."""
    net = Network(load_network(SMALL.spec.network), MPI.COMM_WORLD.size)
    return TimedComm(comm, Timeline(), net, "tp")


def groups() -> Iterator[MPI.Comm]:
    """Sub-communicators of the first N ranks, for every N of GROUPS that fits."""
    world = MPI.COMM_WORLD
    for n in GROUPS:
        if n > world.size:
            continue
        comm = world.Split(0 if world.rank < n else MPI.UNDEFINED, world.rank)
        if comm != MPI.COMM_NULL:
            yield comm
            comm.Free()
        world.Barrier()


def operands(size: int, k: int = K, dtype: type = np.float32) -> tuple[list, list]:
    rng = np.random.default_rng(11)
    xs = [rng.standard_normal((M, k)).astype(dtype) for _ in range(size)]
    ws = [rng.standard_normal((k, N)).astype(dtype) for _ in range(size)]
    return xs, ws


def overlap(strategy: str, bidirectional: bool = True, pieces: int = 0) -> Overlap:
    return Overlap(strategy, bidirectional, comm_cus=1, pieces=pieces)


def run_rs(comm: MPI.Comm, ov: Overlap, mode: str, xs: list, ws: list) -> np.ndarray | None:
    tc = small_tiles_comm(comm)
    r = comm.rank
    x, w = (xs[r], ws[r]) if xs else (None, None)
    out, _ = gemm_then_reduce(tc, x, w, cost=SMALL, shape=GemmShape(M, N, K), mode=mode,
                              dtype="fp16", after=0.0, overlap=ov, name="t")
    return out


def expected(comm: MPI.Comm, ov: Overlap, mode: str, xs: list, ws: list) -> np.ndarray:
    ref = gemm_rs_reference(xs, ws, bidirectional=ov.bidirectional, fused=ov.traits.fused)
    return np.concatenate(ref) if mode == "all_reduce" else ref[comm.rank]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode", ["reduce_scatter", "all_reduce"])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_gemm_rs_is_bitwise_equal_to_the_order_matched_reference(strategy: str,
                                                                 bidirectional: bool,
                                                                 mode: str) -> None:
    for comm in groups():
        xs, ws = operands(comm.size)
        ov = overlap(strategy, bidirectional)
        out = run_rs(comm, ov, mode, xs, ws)
        np.testing.assert_array_equal(out, expected(comm, ov, mode, xs, ws))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("strategy", FUSED)
def test_gemm_rs_is_close_to_the_unsharded_product(strategy: str) -> None:
    for comm in groups():
        xs, ws = operands(comm.size, dtype=np.float64)
        out = run_rs(comm, overlap(strategy), "reduce_scatter", xs, ws)
        lo, hi = chunk_bounds(M, comm.size)[comm.rank]
        full = np.concatenate(xs, axis=1) @ np.concatenate(ws, axis=0)
        np.testing.assert_allclose(out, full[lo:hi], rtol=1e-12, atol=1e-12)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("pieces", [1, 2, 5])
def test_sub_chunk_count_does_not_change_the_result(pieces: int) -> None:
    for comm in groups():
        xs, ws = operands(comm.size)
        out = run_rs(comm, overlap("t3-mca", pieces=pieces), "all_reduce", xs, ws)
        ref = run_rs(comm, overlap("t3-mca", pieces=1), "all_reduce", xs, ws)
        np.testing.assert_array_equal(out, ref)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_ag_gemm_is_bitwise_equal_to_the_block_reference(strategy: str,
                                                         bidirectional: bool) -> None:
    for comm in groups():
        rng = np.random.default_rng(2)
        x = rng.standard_normal((M, K)).astype(np.float32)
        w = rng.standard_normal((K, N)).astype(np.float32) + comm.rank
        shards = [x[lo:hi] for lo, hi in chunk_bounds(M, comm.size)]
        ov = overlap(strategy, bidirectional)
        y, _ = gather_then_gemm(small_tiles_comm(comm), shards[comm.rank].copy(), w, cost=SMALL,
                                shape=GemmShape(M, N, K), dtype="fp16", after=0.0,
                                overlap=ov, name="g")
        ref = ag_gemm_reference(shards, w, bidirectional=bidirectional,
                                fused=ov.traits.fused)
        np.testing.assert_array_equal(y, ref)
        np.testing.assert_allclose(y, x @ w, rtol=1e-5, atol=1e-5)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_timing_only_runs_the_same_schedule(strategy: str) -> None:
    """x = w = None: header-only messages, identical emulated times."""
    for comm in groups():
        xs, ws = operands(comm.size)
        ov = overlap(strategy)
        spans = []
        for data in ((xs, ws), ([], [])):
            tc = small_tiles_comm(comm)
            r = comm.rank
            x, w = (data[0][r], data[1][r]) if data[0] else (None, None)
            _, span = gemm_then_reduce(tc, x, w, cost=SMALL, shape=GemmShape(M, N, K),
                                       mode="all_reduce", dtype="fp16", after=1e-6,
                                       overlap=ov, name="t")
            spans.append(span)
        assert spans[0] == spans[1]


@pytest.mark.parametrize("mode", ["reduce_scatter", "all_reduce"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_single_rank_just_multiplies(strategy: str, mode: str) -> None:
    xs, ws = operands(1)
    tc = small_tiles_comm(MPI.COMM_SELF)
    out, span = gemm_then_reduce(tc, xs[0], ws[0], cost=SMALL, shape=GemmShape(M, N, K), mode=mode,
                                 dtype="fp16", after=0.0, overlap=overlap(strategy), name="t")
    np.testing.assert_array_equal(out, xs[0] @ ws[0])
    y, _ = gather_then_gemm(tc, xs[0], ws[0], cost=SMALL, shape=GemmShape(M, N, K), dtype="fp16",
                            after=span.t_end, overlap=overlap(strategy), name="g")
    np.testing.assert_array_equal(y, xs[0] @ ws[0])

"""A ring collective costs the same emulated time standalone (comm.ring) and after its GEMM in
the overlap engine's `sequential` strategy: one ring model, two call sites."""
from __future__ import annotations

import pytest
from mpi4py import MPI

from mpiemu.comm.ring import all_reduce, reduce_scatter
from mpiemu.overlap.api import GemmShape, gemm_then_reduce
from mpiemu.overlap.strategy import Overlap
from tests.timed import timed_comm


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("mode", ["reduce_scatter", "all_reduce"])
def test_sequential_collective_matches_the_standalone_ring(mode: str,
                                                           bidirectional: bool) -> None:
    comm = MPI.COMM_WORLD
    m, n, k = 512 * comm.size, 1024, 256
    paired = timed_comm(comm)
    _, span = gemm_then_reduce(paired, None, None, shape=GemmShape(m, n, k), mode=mode,
                               dtype="fp16", after=0.0,
                               overlap=Overlap("sequential", bidirectional=bidirectional),
                               name="x")
    gemm_s = paired.model.gemm(m, n, k, dtype="fp16").time_s
    coll = reduce_scatter if mode == "reduce_scatter" else all_reduce
    _, alone = coll(timed_comm(comm), None, count=m * n, wire_itemsize=2,
                    bidirectional=bidirectional, unit=n)
    assert span.duration - gemm_s == pytest.approx(alone.duration, rel=1e-9)

"""Emulated time of the strategies on a thesis sub-layer (timing only), and their trace events."""
from __future__ import annotations

from typing import Any

import pytest
from mpi4py import MPI

from tests.timed import timed_comm
from mpiemu.devices import load_device, device_cost
from mpiemu.overlap.api import GemmShape, gather_then_gemm, gemm_then_reduce
from mpiemu.overlap.costs import OverlapStats
from mpiemu.overlap.strategy import STRATEGIES, Overlap
from mpiemu.sim.events import CATS, StringTable
from mpiemu.sim.timeline import Timeline

CAT_NAMES = {v: k for k, v in CATS.items()}
T3 = device_cost(load_device("t3-gpu"))


class Recorder:
    """Stands in for a TraceWriter: keeps rows in memory."""

    def __init__(self) -> None:
        self.strings = StringTable()
        self.rows: list[tuple[Any, ...]] = []

    def add(self, row: tuple[Any, ...]) -> None:
        self.rows.append(row)

    def events(self) -> list[dict[str, Any]]:
        names = {c: s for s, c in self.strings.items()}
        return [{"name": names[r[0]], "cat": CAT_NAMES[r[1]], "t0": r[3], "t1": r[4],
                 "stage": r[14]} for r in self.rows]


def fc2(comm: MPI.Comm) -> GemmShape:
    """T-NLG FC-2 forward (8K tokens, H=4256) sliced over the job's ranks."""
    return GemmShape(8192, 4256, 4 * 4256 // comm.size)


def run(strategy: str, *, rec: Recorder | None = None, comm_cus: int = 16
        ) -> tuple[float, OverlapStats]:
    comm = MPI.COMM_WORLD
    tc = timed_comm(comm)
    tc.tl = Timeline(rec)  # type: ignore[arg-type]
    stats = OverlapStats()
    _, span = gemm_then_reduce(tc, None, None, cost=T3, shape=fc2(comm), mode="all_reduce",
                               dtype="fp16", after=0.0, name="fc2", stats=stats,
                               overlap=Overlap(strategy, True, comm_cus=comm_cus))
    return comm.allreduce(span.t_end, op=MPI.MAX), stats


@pytest.mark.mpi(min_size=2)
def test_same_inputs_give_bit_identical_times() -> None:
    for s in STRATEGIES:
        assert run(s)[0] == run(s)[0]


@pytest.mark.mpi(min_size=2)
def test_overlap_never_loses_to_sequential_without_contention() -> None:
    seq = run("sequential")[0]
    assert run("ideal")[0] < seq
    assert run("ideal+nmc")[0] <= run("ideal")[0]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("strategy", ["t3", "t3-mca"])
def test_fused_t3_cannot_beat_its_own_gemm_plus_the_all_gather(strategy: str) -> None:
    """Dependencies and contention only add time to the (uncached-output) GEMM + AG."""
    t, st = run(strategy)
    assert t >= (st.gemm_isolated_s + st.ag_s) * (1 - 1e-12)
    assert st.gemm_s >= st.gemm_isolated_s * (1 - 1e-12)


@pytest.mark.mpi(min_size=2)
def test_mca_slows_the_gemm_less_than_round_robin() -> None:
    _, t3 = run("t3")
    _, mca = run("t3-mca")
    assert t3.gemm_s > mca.gemm_s >= mca.gemm_isolated_s * (1 - 1e-12)
    assert mca.mca_threshold in (5, 10, 30, 64)


@pytest.mark.mpi(min_size=2)
def test_software_overlap_gemm_loses_the_communication_cus() -> None:
    _, sw = run("sw-overlap", comm_cus=16)
    _, seq = run("sequential")
    assert sw.gemm_isolated_s > seq.gemm_isolated_s
    assert sw.n_stages > seq.n_stages


@pytest.mark.mpi(min_size=2)
def test_t3_moves_less_dram_data_than_sequential() -> None:
    """Thesis 8.5.2: fusion, NMC and uncached output cut DRAM traffic."""
    _, seq = run("sequential")
    _, t3 = run("t3-mca")
    assert t3.dram_total < seq.dram_total
    assert t3.dram["rs_read"] < seq.dram["rs_read"] / 2
    assert t3.dram["ag_read"] == seq.dram["ag_read"]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_events_name_the_gemm_and_the_all_reduce(strategy: str) -> None:
    rec = Recorder()
    run(strategy, rec=rec)
    ev = rec.events()
    gemm = [e for e in ev if e["name"] == "fc2.gemm"]
    n_stages = device_cost(load_device("t3-gpu")).gemm(*fc2(MPI.COMM_WORLD)).n_stages
    assert gemm and all(e["cat"] == "compute" for e in gemm)
    if strategy != "sw-overlap":          # sw-overlap runs its GEMM on fewer CUs
        assert {e["stage"] for e in gemm} == {n_stages}
    assert [e["cat"] for e in ev if e["name"] == "fc2.ar"] == ["collective"]
    assert any(e["name"] == "rs.send" and e["cat"] == "comm" for e in ev)
    assert any(e["name"] == "ag.send" and e["cat"] == "comm" for e in ev)


def run_ag(strategy: str) -> tuple[float, OverlapStats]:
    """T-NLG FC-1 forward under sequence parallelism: all-gather rows, then the GEMM."""
    comm = MPI.COMM_WORLD
    tc = timed_comm(comm)
    stats = OverlapStats()
    shape = GemmShape(8192, 4 * 4256 // comm.size, 4256)
    _, span = gather_then_gemm(tc, None, None, cost=T3, shape=shape, dtype="fp16", after=0.0,
                               overlap=Overlap(strategy, True), name="fc1", stats=stats)
    return comm.allreduce(span.t_end, op=MPI.MAX), stats


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("strategy", ["ideal", "t3", "t3-mca"])
def test_all_gather_then_gemm_overlaps_the_gather(strategy: str) -> None:
    seq, st = run_ag("sequential")
    t, _ = run_ag(strategy)
    gather_then_multiply = MPI.COMM_WORLD.allreduce(st.ag_s + st.gemm_isolated_s, op=MPI.MAX)
    assert seq == pytest.approx(gather_then_multiply, rel=1e-9)
    assert st.gemm_isolated_s <= t < seq

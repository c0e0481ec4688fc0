"""What the training schedule does in emulated time: activations in flight per stage, the
asynchronous TP gradient reduction, DP reduction during or after backward, ZeRO-1 traffic."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

from mpiemu.analysis import load
from mpiemu.model.pipeline_schedules import in_flight, order
from mpiemu.runner.job import run_workload

BASE = ["run.kind='train'", "run.iterations=1", "run.numerics='off'", "model.preset='tiny'",
        "model.layers=4", "train.global_batch=8", "train.dp_bucket_MiB=0.02",
        "device.preset='a100-sxm4-80gb'"]


def run(out: Path, *sets: str) -> dict[str, Any]:
    summary = run_workload(None, [*BASE, *sets], str(out), [], world=MPI.COMM_WORLD)
    MPI.COMM_WORLD.Barrier()          # every rank's trace is compacted before anyone reads
    return summary


def spans(rt: Any, prefix: str, cat: str) -> tuple[np.ndarray, np.ndarray]:
    m = np.char.startswith(rt.names.astype(str), prefix) & (rt.cats == cat)
    return rt.events["t_start"][m], rt.events["t_end"][m]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "interleaved"])
def test_each_stage_holds_the_micro_batches_its_schedule_has_in_flight(
        mpi_tmp_path: Path, schedule: str) -> None:
    """1F1B: stage i keeps p - i micro-batches of activations at its peak (GPipe: all m)."""
    p = MPI.COMM_WORLD.Get_size()
    v = 2 if schedule == "interleaved" else 1
    s = run(mpi_tmp_path, f"parallel.pp={p}", f"parallel.schedule='{schedule}'",
            f"parallel.virtual_stages={v}", f"model.layers={p * v}", "train.micro_batch=1")
    want = {str(i): in_flight(order(schedule, p, i, 8, v)) for i in range(p)}
    assert s["in_flight"] == want
    if schedule == "1f1b":
        assert [s["in_flight"][str(i)] for i in range(p)] == [p - i for i in range(p)]


@pytest.mark.mpi(min_size=2)
def test_tp_input_gradient_reduction_runs_under_the_weight_gradient_gemm(
        mpi_tmp_path: Path) -> None:
    tp = MPI.COMM_WORLD.Get_size()
    wide = ("model.hidden=4096", "model.heads=32", "model.ffn_hidden=16384",
            "model.seq_len=2048")    # GEMMs that fill every SM, all-reduces on every channel
    run(mpi_tmp_path, f"parallel.tp={tp}", *wide)
    rt = load(mpi_tmp_path).ranks[MPI.COMM_WORLD.Get_rank()]
    under = {}
    for layer in ("qkv", "fc1"):
        a0, a1 = spans(rt, f"l0.{layer}.bwd.ar", "collective")
        w0, w1 = spans(rt, f"l0.{layer}.wgrad", "compute")
        assert len(a0) == len(w0) == 1
        assert a0[0] <= w0[0] < a1[0]          # the wgrad GEMM starts while it moves
        under[layer] = w1[0] - w0[0]
    out = mpi_tmp_path / "serialized"
    run(out, f"parallel.tp={tp}", "train.tp_comm_async=false", *wide)
    rt = load(out).ranks[MPI.COMM_WORLD.Get_rank()]
    a0, _ = spans(rt, "l0.qkv.bwd.ar", "collective")
    w0, w1 = spans(rt, "l0.qkv.wgrad", "compute")
    assert w1[0] <= a0[0]                      # thesis layer: wgrad, then dgrad + all-reduce
    # NCCL's kernel holds one SM per channel while it moves (sim.sms): the wgrad GEMM
    # under it runs on the SMs left, slower than alone
    assert under["qkv"] > w1[0] - w0[0]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("overlap", [True, False])
def test_dp_buckets_reduce_during_backward_or_after_it(mpi_tmp_path: Path,
                                                       overlap: bool) -> None:
    dp = MPI.COMM_WORLD.Get_size()
    run(mpi_tmp_path, f"parallel.dp={dp}", f"train.overlap_grad_reduce={str(overlap).lower()}")
    rt = load(mpi_tmp_path).ranks[MPI.COMM_WORLD.Get_rank()]
    b0, _ = spans(rt, "dp.bucket", "collective")
    scaling = np.char.endswith(rt.names.astype(str), ".scale")     # each bucket's, before it
    bwd = (rt.cats == "compute") & (rt.phases == "bwd") & ~scaling
    last_bwd = rt.events["t_end"][bwd].max()
    assert len(b0) >= 2
    assert (b0.min() < last_bwd) == overlap


@pytest.mark.mpi(min_size=2)
def test_distributed_optimizer_reduce_scatters_and_gathers_and_shards_its_state(
        mpi_tmp_path: Path) -> None:
    dp = MPI.COMM_WORLD.Get_size()
    plain = run(mpi_tmp_path / "plain", f"parallel.dp={dp}")
    zero = run(mpi_tmp_path / "zero", f"parallel.dp={dp}", "optimizer.zero=1")
    rt = load(mpi_tmp_path / "zero").ranks[MPI.COMM_WORLD.Get_rank()]
    names = set(rt.names.astype(str))
    assert any(n.startswith("dp.param_gather") for n in names)
    sends = [n for n in names if n in ("rs.send", "ag.send")]
    assert sends
    assert zero["memory"]["optimizer_bytes"] == pytest.approx(
        plain["memory"]["optimizer_bytes"] / dp)

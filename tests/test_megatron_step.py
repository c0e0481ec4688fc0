"""What Megatron-LM's step launches around the layers: the vocab-parallel cross-entropy's
passes over the fp32 logits, and the gradient buffer's averaging over DP (per bucket in
Megatron core's DDP, the whole buffer once in 2022's local DDP, even at DP 1)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

from mpiemu.analysis import load
from mpiemu.analysis.rank_trace import RankTrace
from mpiemu.devices.kernels import cross_entropy
from mpiemu.model.presets import load_model_preset
from mpiemu.model.tensor_parallel import local_params
from mpiemu.runner.job import run_workload

S, BATCH = 16, 8                      # the tiny preset


def test_cross_entropy_streams_the_fp32_logits_once_per_pass() -> None:
    """Megatron's vocab-parallel cross-entropy (fused kernel mode: Megatron's own ops) and
    plain PyTorch's log_softmax + nll_loss (unfused), over fp32 logits."""
    rows, vocab, n = 6, 10, 60
    fwd = {k.tag: k for k in cross_entropy(rows, vocab, 2, "fused")}
    assert list(fwd) == ["cast", "max", "sub", "target", "exp", "sum", "div"]
    assert (fwd["cast"].read_bytes, fwd["cast"].write_bytes) == (2 * n, 4 * n)
    assert (fwd["exp"].read_bytes, fwd["exp"].write_bytes, fwd["exp"].sfu_ops) == (4 * n, 4 * n, n)
    assert all(fwd[t].read_bytes >= 4 * n for t in ("max", "sub", "sum", "div"))
    bwd = [k.tag for k in cross_entropy(rows, vocab, 2, "fused", backward=True)]
    assert bwd == ["target", "scale", "cast"]
    assert "cast" not in {k.tag for k in cross_entropy(rows, vocab, 4, "fused")}  # fp32 logits
    plain = cross_entropy(rows, vocab, 2, "unfused")
    assert [k.tag for k in plain] == ["cast", "log_softmax", "target"]
    assert (plain[1].read_bytes, plain[1].write_bytes) == (4 * n, 4 * n)
    back = cross_entropy(rows, vocab, 4, "unfused", backward=True)
    assert [k.tag for k in back] == ["zero", "target", "log_softmax.bwd"]
    assert (back[2].read_bytes, back[2].write_bytes) == (8 * n, 4 * n)


def train(out: Path, dp: int, *extra: str) -> list[RankTrace]:
    sets = ["run.kind='train'", "run.iterations=1", "parallel.tp=1", f"parallel.dp={dp}",
            "model.preset='tiny'", "run.emulated_dtype='fp16'", "train.dp_bucket_MiB=0.02",
            *extra]
    comm = MPI.COMM_WORLD.Split(int(MPI.COMM_WORLD.Get_rank() < dp))
    if MPI.COMM_WORLD.Get_rank() < dp:
        run_workload(None, sets, str(out), [], world=comm)
    MPI.COMM_WORLD.Barrier()
    comm.Free()
    return load(out).ranks


def scaled(rt: RankTrace) -> dict[str, float]:
    """Scaling kernels -> their DRAM bytes."""
    names = rt.names.astype(str)
    m = np.char.endswith(names, ".scale") & np.char.startswith(names, "dp.")
    m |= names == "dp.grad_scale"
    return {str(n): float(b) for n, b in zip(names[m], rt.events["dram_bytes"][m])}


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dp", [1, 2])
def test_core_ddp_scales_each_bucket_before_reducing_it_when_dp_is_above_one(
        mpi_tmp_path: Path, dp: int) -> None:
    ranks = train(mpi_tmp_path, dp)
    total = sum(lp.size for lp in local_params(load_model_preset("tiny").config, 1))
    for rt in ranks:
        got = scaled(rt)
        assert (sum(got.values()) == 2 * 2 * total) if dp > 1 else got == {}
        for name in got:                       # each right before its bucket's collective
            bucket = name.removesuffix(".scale")
            end = rt.events["t_end"][rt.names == name][0]
            start = rt.events["t_start"][rt.names == bucket][0]
            assert end <= start


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dp", [1, 2])
def test_local_ddp_divides_the_whole_buffer_once_even_at_dp_one(mpi_tmp_path: Path,
                                                                dp: int) -> None:
    ranks = train(mpi_tmp_path, dp, "train.ddp='local'", "train.overlap_grad_reduce=false")
    total = sum(lp.size for lp in local_params(load_model_preset("tiny").config, 1))
    for rt in ranks:
        assert scaled(rt) == {"dp.grad_scale": 2 * 2 * total}      # read + write, fp16
        buckets = {str(n) for n in rt.names if str(n).startswith("dp.bucket")}
        assert buckets == ({"dp.bucket0"} if dp > 1 else set())     # one reduction


@pytest.mark.mpi(min_size=2)
def test_nothing_scales_without_megatrons_buffer(mpi_tmp_path: Path) -> None:
    for rt in train(mpi_tmp_path, 2, "optimizer.name='lamb'"):
        assert scaled(rt) == {}

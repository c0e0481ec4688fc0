"""Mixture of Experts sharded equals the one-process reference (float64, 3 steps, 1e-10):
expert parallelism over 2 and 4 ranks with DP, TP (+SP), PP and CP, expert tensor
parallelism; top-1 and top-2;
dropless and with a capacity factor; shared experts; softmax and sigmoid routing with
group-limited choice and the expert bias; the auxiliary and z losses on. The reference
routes each rank's tokens as that rank does (capacity is per rank) and computes the
balancing losses per micro-batch (`training/reference_moe.py`). Grids whose size equals
the MPI world run in-process (`make test` runs them at 2 and 4 ranks)."""
from __future__ import annotations

from pathlib import Path

import pytest
from mpi4py import MPI

from mpiemu.runner.job import run_workload
from tests.test_train_parity import assert_matches_reference

SIGMOID = ["moe.score='sigmoid'", "moe.expert_bias=true", "moe.bias_update_rate=0.01",
           "moe.groups=4", "moe.group_top_k=2", "moe.topk_scale=2.5"]
CASES = [
    (2, "ep2-dp2", ["parallel.dp=2", "parallel.ep=2"]),
    (2, "ep2-top1-capacity", ["parallel.dp=2", "parallel.ep=2", "moe.top_k=1",
                              "moe.capacity_factor=1.0"]),
    (2, "ep2-tp2-sp", ["parallel.tp=2", "parallel.sequence_parallel=true", "parallel.ep=2"]),
    (2, "pp2-shared", ["parallel.pp=2", "moe.shared_ffn=32"]),
    (2, "tp2-sp-shared-ep1", ["parallel.tp=2", "parallel.sequence_parallel=true",
                              "moe.shared_ffn=32"]),
    (2, "ep2-cp2", ["parallel.cp=2", "parallel.ep=2", "model.attention='flash'"]),
    (2, "ep2-sigmoid-bias-groups", ["parallel.dp=2", "parallel.ep=2", *SIGMOID]),
    (2, "ep2-tp2-sp-seq-aux-micro2", ["parallel.tp=2", "parallel.sequence_parallel=true",
                                      "parallel.ep=2", "moe.aux_loss='seq'",
                                      "train.micro_batch=2"]),
    (2, "ep2-allgather-tp2-sp-capacity", ["parallel.tp=2", "parallel.sequence_parallel=true",
                                          "parallel.ep=2", "moe.dispatcher='allgather'",
                                          "moe.capacity_factor=1.0"]),
    (4, "ep4-allgather-dp4-shared", ["parallel.dp=4", "parallel.ep=4", "moe.shared_ffn=32",
                                     "moe.dispatcher='allgather'"]),
    (4, "ep4-shared-overlap", ["parallel.dp=4", "parallel.ep=4", "moe.shared_ffn=32",
                               "moe.shared_overlap=true"]),
    # Megatron's distributed optimizer: experts sharded over expert DP (EP 2 of DP 4), kept
    # whole where each lives on one rank (EP 4), in the DP buckets where EP = TP
    (4, "zero1-ep2-dp4", ["parallel.dp=4", "parallel.ep=2", "optimizer.zero=1"]),
    (4, "zero1-ep4-dp4-top1", ["parallel.dp=4", "parallel.ep=4", "optimizer.zero=1",
                               "moe.top_k=1"]),
    (4, "zero1-tp2-dp2-ep2", ["parallel.tp=2", "parallel.dp=2", "parallel.ep=2",
                              "parallel.sequence_parallel=true", "optimizer.zero=1"]),
    (4, "zero1-tp2-dp2-ep1", ["parallel.tp=2", "parallel.dp=2",
                              "parallel.sequence_parallel=true", "optimizer.zero=1"]),
    # ZeRO-2 / 3: the experts' units reduce-scattered and gathered over expert DP, the rest
    # over DP x CP
    (4, "zero2-ep2-dp4", ["parallel.dp=4", "parallel.ep=2", "optimizer.zero=2"]),
    (4, "zero3-tp2-dp2-ep2", ["parallel.tp=2", "parallel.dp=2", "parallel.ep=2",
                              "parallel.sequence_parallel=true", "optimizer.zero=3"]),
    (4, "ep4-capacity-micro2", ["parallel.dp=4", "parallel.ep=4", "moe.capacity_factor=1.25",
                                "train.global_batch=16", "train.micro_batch=2"]),
    (4, "ep2-tp2-dp2-shared", ["parallel.tp=2", "parallel.dp=2", "parallel.ep=2",
                               "parallel.sequence_parallel=true", "moe.shared_ffn=32"]),
    (4, "ep4-tp2-dp2-top1", ["parallel.tp=2", "parallel.dp=2", "parallel.ep=4",
                             "parallel.sequence_parallel=true", "moe.top_k=1"]),
    (4, "ep2-pp2-dp2-capacity", ["parallel.pp=2", "parallel.dp=2", "parallel.ep=2",
                                 "moe.capacity_factor=1.0", "moe.top_k=1"]),
    (4, "ep4-cp2-dp2", ["parallel.cp=2", "parallel.dp=2", "parallel.ep=4",
                        "model.attention='flash'"]),
    # expert tensor parallelism: each expert's FFN over ETP ranks (rows gathered before,
    # partial outputs reduce-scattered after), as TP, across TP and EP, over DP and PP
    (2, "etp2-eq-tp2-sp-shared", ["parallel.tp=2", "parallel.sequence_parallel=true",
                                  "parallel.etp=2", "moe.shared_ffn=32"]),
    (2, "etp2-dp2-allgather-top1-capacity", ["parallel.dp=2", "parallel.etp=2",
                                             "moe.dispatcher='allgather'", "moe.top_k=1",
                                             "moe.capacity_factor=1.0"]),
    (4, "etp2-ep2-tp2-dp2", ["parallel.tp=2", "parallel.dp=2", "parallel.ep=2",
                             "parallel.etp=2", "parallel.sequence_parallel=true"]),
    (4, "etp2-dp4-zero2-capacity", ["parallel.dp=4", "parallel.etp=2", "optimizer.zero=2",
                                    "moe.capacity_factor=1.25"]),
    (4, "etp2-ep2-dp4-allgather-shared", ["parallel.dp=4", "parallel.ep=2", "parallel.etp=2",
                                          "moe.dispatcher='allgather'", "moe.shared_ffn=32"]),
    (4, "etp2-pp2-dp2-top1", ["parallel.pp=2", "parallel.dp=2", "parallel.etp=2",
                              "moe.top_k=1"]),
    (4, "ep4-sigmoid-bias-groups-shared", ["parallel.dp=4", "parallel.ep=4", *SIGMOID,
                                           "moe.shared_ffn=32", "train.recompute='full'"]),
]


def overrides(*extra: str) -> list[str]:
    return ["run.kind='train'", "run.iterations=3", "run.numerics='on'",
            "run.numeric_dtype='fp64'", "model.preset='tiny-moe'", "model.layers=2",
            "train.check_reference=true", "train.dp_bucket_MiB=0.02", "optimizer.zero=0",
            "train.global_batch=8", *extra]     # a later optimizer.zero wins


@pytest.mark.mpi
@pytest.mark.parametrize("ranks, name, extra", CASES, ids=[c[1] for c in CASES])
def test_experts_match_the_reference(mpi_tmp_path: Path, ranks: int, name: str,
                                     extra: list[str]) -> None:
    if MPI.COMM_WORLD.Get_size() != ranks:
        pytest.skip(f"a {ranks}-rank grid")
    assert_matches_reference(run_workload(None, overrides(*extra), str(mpi_tmp_path / name),
                                          [], world=MPI.COMM_WORLD))

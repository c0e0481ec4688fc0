"""Llama-family blocks sharded equal the one-process reference (float64, 3 steps, 1e-10):
RMSNorm, SwiGLU, RoPE with Llama 3.1's scaling, no biases, untied embeddings, and grouped-
query attention with fewer KV heads than TP ranks (replicated through the gathered QKV
output, as Megatron-Core), as many, and more; with SP, pipeline stages, DP, each
recomputation mode and flash attention; Qwen3's attention (heads of `kv_channels`, QK-norm)
under TP, SP, CP, PP, ZeRO-3 and experts; DeepSeek-V3's multi-head latent attention under TP,
SP, PP, DP, ZeRO-3, recomputation and experts. Grids whose size equals the MPI world run
in-process (`make test` runs them at 2 and 4 ranks)."""
from __future__ import annotations

from pathlib import Path

import pytest
from mpi4py import MPI

from mpiemu.runner.job import run_workload
from tests.test_train_parity import assert_matches_reference

QWEN = ["model.kv_channels=16", "model.qk_norm=true"]
# MLA on the tiny Llama: query latent 24, KV latent 16, heads of 8 + 8 rotated, values of 12
MLA = ["model.kv_heads=0", "model.q_lora_rank=24", "model.kv_lora_rank=16",
       "model.qk_rope_dim=8", "model.v_head_dim=12"]
# (ranks, id, overrides): kv_heads < tp, = tp, > tp on the tiny Llama (8 heads, 2 KV heads)
CASES = [
    (2, "kv-eq-tp", ["parallel.tp=2"]),
    (2, "kv-lt-tp-mqa-sp", ["parallel.tp=2", "model.kv_heads=1",
                            "parallel.sequence_parallel=true"]),
    (2, "kv-gt-tp-flash", ["parallel.tp=2", "model.kv_heads=4", "model.attention='flash'"]),
    (2, "pp-dropout", ["parallel.pp=2", "model.hidden_dropout=0.1",
                       "model.attention_dropout=0.1"]),
    (4, "kv-lt-tp-sp", ["parallel.tp=4", "parallel.sequence_parallel=true"]),
    (4, "tp-pp-selective", ["parallel.tp=2", "parallel.pp=2", "train.recompute='selective'",
                            "parallel.sequence_parallel=true"]),
    (4, "tp-dp-full", ["parallel.tp=2", "parallel.dp=2", "train.recompute='full'",
                       "model.kv_heads=1"]),
    (4, "dp-distributed", ["parallel.dp=4", "optimizer.zero=1"]),
    # uneven pipeline stages (Megatron-Core's first/last stage layers; embedding and loss
    # counted as layers, Llama 3's 405B layout)
    (2, "pp2-first-last", ["parallel.pp=2", "model.layers=5", "parallel.first_stage_layers=2",
                           "parallel.last_stage_layers=3"]),
    (2, "pp2-loss-split", ["parallel.pp=2", "model.layers=5", "parallel.loss_in_split=true"]),
    (4, "pp4-embedding-loss-split", ["parallel.pp=4", "model.layers=6",
                                     "parallel.embedding_in_split=true",
                                     "parallel.loss_in_split=true"]),
    # context parallelism (flash attention, as Transformer Engine requires)
    (2, "cp2-ring", ["parallel.cp=2", "model.attention='flash'"]),
    (2, "cp2-allgather-dropout", ["parallel.cp=2", "parallel.cp_comm='all_gather'",
                                  "model.attention='flash'", "model.attention_dropout=0.1",
                                  "model.hidden_dropout=0.1"]),
    (4, "cp4-ring-selective", ["parallel.cp=4", "model.attention='flash'",
                               "train.recompute='selective'"]),
    (4, "cp4-allgather-full", ["parallel.cp=4", "parallel.cp_comm='all_gather'",
                               "model.attention='flash'", "train.recompute='full'"]),
    (4, "cp2-tp2-sp", ["parallel.cp=2", "parallel.tp=2", "parallel.sequence_parallel=true",
                       "model.attention='flash'", "model.kv_heads=1"]),
    (4, "cp2-pp2", ["parallel.cp=2", "parallel.pp=2", "model.attention='flash'"]),
    # ZeRO-2 and ZeRO-3 / FSDP (prefetch on and off, resharded after forward or not)
    (2, "zero2-micro", ["parallel.dp=2", "optimizer.zero=2", "train.micro_batch=1"]),
    (2, "zero3-micro", ["parallel.dp=2", "optimizer.zero=3", "train.micro_batch=2"]),
    (2, "zero3-no-prefetch-keep", ["parallel.dp=2", "optimizer.zero=3",
                                   "optimizer.prefetch=false",
                                   "optimizer.reshard_after_forward=false"]),
    (4, "zero3-tp2-sp-full", ["parallel.dp=2", "parallel.tp=2", "optimizer.zero=3",
                              "parallel.sequence_parallel=true", "train.recompute='full'"]),
    (4, "zero3-pp2-selective", ["parallel.dp=2", "parallel.pp=2", "optimizer.zero=3",
                                "train.recompute='selective'", "train.micro_batch=1"]),
    (4, "zero2-cp2", ["parallel.dp=2", "parallel.cp=2", "optimizer.zero=2",
                      "model.attention='flash'"]),
    (4, "hsdp-zero3-2x2", ["parallel.dp=4", "optimizer.zero=3", "optimizer.shard_group=2"]),
    (4, "hsdp-zero2-cp2-micro", ["parallel.dp=2", "parallel.cp=2", "optimizer.zero=2",
                                 "optimizer.shard_group=2", "model.attention='flash'",
                                 "train.micro_batch=2"]),
    (4, "zero3-dp4-no-prefetch", ["parallel.dp=4", "optimizer.zero=3",
                                  "optimizer.prefetch=false"]),
    (4, "cp2-dp2-distributed", ["parallel.cp=2", "parallel.dp=2", "optimizer.zero=1",
                                "model.attention='flash'"]),
    # Qwen3 attention: heads of 16 (not hidden / heads = 8: q 64 -> 128, o 128 -> 64) with
    # QK-norm, whose gains' gradients are summed over TP with and without SP
    (2, "qwen-tp2", ["parallel.tp=2", *QWEN]),
    (2, "qwen-cp2-flash", ["parallel.cp=2", "model.attention='flash'", *QWEN]),
    (2, "qwen-pp2", ["parallel.pp=2", *QWEN]),
    (2, "qwen-moe-ep2-tp2-sp", ["model.preset='tiny-moe'", "optimizer.zero=0", "parallel.tp=2",
                                "parallel.sequence_parallel=true", "parallel.ep=2", *QWEN]),
    (4, "qwen-tp4-mqa-sp", ["parallel.tp=4", "model.kv_heads=1",
                            "parallel.sequence_parallel=true", *QWEN]),
    (4, "qwen-tp2-dp2-zero3", ["parallel.tp=2", "parallel.dp=2", "optimizer.zero=3", *QWEN]),
    # MLA: replicated down projections and latent norms (partial gradients under SP), heads
    # split over TP, the shared rotated key gathered over SP and its gradient reduced
    (2, "mla-tp2", ["parallel.tp=2", *MLA]),
    (2, "mla-tp2-sp-flash", ["parallel.tp=2", "parallel.sequence_parallel=true",
                             "model.attention='flash'", *MLA]),
    (2, "mla-dp2-no-q-latent-dropout", ["parallel.dp=2", *MLA, "model.q_lora_rank=0",
                                        "model.hidden_dropout=0.1",
                                        "model.attention_dropout=0.1"]),
    (2, "mla-moe-ep2-tp2-sp", ["model.preset='tiny-moe'", "optimizer.zero=0", "parallel.tp=2",
                               "parallel.sequence_parallel=true", "parallel.ep=2", *MLA]),
    (4, "mla-tp2-dp2-sp-selective", ["parallel.tp=2", "parallel.dp=2", "train.recompute="
                                     "'selective'", "parallel.sequence_parallel=true", *MLA]),
    (4, "mla-tp2-pp2-full", ["parallel.tp=2", "parallel.pp=2", "train.recompute='full'",
                             *MLA]),
    (4, "mla-tp4-sp-flash", ["parallel.tp=4", "parallel.sequence_parallel=true", *MLA,
                             "model.attention='flash'"]),
    (4, "mla-dp4-zero3-sdf", ["parallel.dp=4", "optimizer.zero=3", "model.attention='sdf'",
                              *MLA]),
]


def overrides(*extra: str) -> list[str]:
    return ["run.kind='train'", "run.iterations=3", "run.numerics='on'",
            "run.numeric_dtype='fp64'", "model.preset='tiny-llama'",
            "train.check_reference=true", "train.dp_bucket_MiB=0.02", *extra]


@pytest.mark.mpi
@pytest.mark.parametrize("ranks, name, extra", CASES, ids=[c[1] for c in CASES])
def test_llama_blocks_match_the_reference(mpi_tmp_path: Path, ranks: int, name: str,
                                          extra: list[str]) -> None:
    if MPI.COMM_WORLD.Get_size() != ranks:
        pytest.skip(f"a {ranks}-rank grid")
    assert_matches_reference(run_workload(None, overrides(*extra), str(mpi_tmp_path / name),
                                          [], world=MPI.COMM_WORLD))

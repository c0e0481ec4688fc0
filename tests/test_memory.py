"""Per-rank memory accounting: what the layers keep, checked against a real step's arrays."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

from tests.timed import timed_comm
from mpiemu.devices import device_cost, load_device
from mpiemu.executors.gpu import GpuExecutor
from mpiemu.executors.registry import ExecutorSetup
from mpiemu.model.config import ModelConfig
from mpiemu.model.dims import make_dims
from mpiemu.model.ops import stored_elements
from mpiemu.model.presets import load_model_preset
from mpiemu.model.stage import StageModel
from mpiemu.overlap.strategy import Overlap
from mpiemu.training.gradients import StageGradients
from mpiemu.training.memory import (Layout, edge_stored, embed_stored, head_stored,
                                    layer_param_count, layer_stored, memory_report,
                                    stage_activations)
from mpiemu.training.pipeline_step import PipelineStep

TINY = load_model_preset("tiny").config


def one_step(cfg: ModelConfig, comm: MPI.Comm, sp: bool, recompute: str = "none"
             ) -> StageModel:
    """A numerics step of the tiny model, TP over `comm`, keeping what forward stored."""
    tp = timed_comm(comm)
    dp = tp.sibling(MPI.COMM_SELF, "dp")
    cfg = cfg.for_tp(comm.size)
    dims = make_dims(cfg, comm.size, 8, sp)
    ex = GpuExecutor(ExecutorSetup(tp.tl, device_cost(load_device("t3-gpu")), tp, dims,
                                   "fp16", True, Overlap()))
    m = StageModel(cfg, ex, dims, tp_rank=comm.rank, dp_rank=0, seed=0, global_batch=8,
                   np_dtype=np.float64, recompute=recompute)
    grads = StageGradients(m, ex, dp, grad_buffer=None, bucket_bytes=1e9, bidirectional=False)
    m.keep_caches = True
    PipelineStep(m, grads, None, "1f1b", 1, np.float64).run(0)
    return m


def assert_accounting_matches(m: StageModel) -> None:
    assert m.last_caches is not None
    c_emb, layers, c_head = m.last_caches
    for c in layers:
        assert stored_elements(c) + (0,) == dataclasses.astuple(layer_stored(m.cfg, m.d,
                                                                             m.recompute))
    edge = [a + b for a, b in zip(stored_elements(c_emb), stored_elements(c_head))]
    assert tuple(edge) + (0,) == dataclasses.astuple(edge_stored(m.cfg, m.d))


@pytest.mark.parametrize("attention", ["baseline", "flash"])
@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_activation_accounting_equals_what_a_step_stores(attention: str, norm: str,
                                                         dropout: float, recompute: str) -> None:
    cfg = dataclasses.replace(TINY, attention=attention, norm=norm, hidden_dropout=dropout,
                              attention_dropout=dropout)
    assert_accounting_matches(one_step(cfg, MPI.COMM_SELF, sp=False, recompute=recompute))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_activation_accounting_matches_sharded_steps(sp: bool, recompute: str) -> None:
    comm = MPI.COMM_WORLD
    if TINY.heads % comm.size or TINY.seq_len % comm.size:
        pytest.skip(f"tiny does not split {comm.size} ways")
    assert_accounting_matches(one_step(TINY, comm, sp, recompute))


# Qwen3's attention on the tiny Llama: heads of 16 (q 64 -> 128) and QK-norm, whose inputs
# and per-head rstd are kept
QWEN = dataclasses.replace(load_model_preset("tiny-llama").config, kv_channels=16,
                           qk_norm=True)


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_qwen3_attention_accounting_equals_what_a_step_stores(recompute: str) -> None:
    assert_accounting_matches(one_step(QWEN, MPI.COMM_SELF, sp=False, recompute=recompute))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("sp", [False, True])
def test_qwen3_attention_accounting_matches_sharded_steps(sp: bool) -> None:
    """At 4 ranks TP exceeds the 2 KV heads: the norms run on the rank's gathered group."""
    comm = MPI.COMM_WORLD
    if QWEN.heads % comm.size or QWEN.seq_len % comm.size:
        pytest.skip(f"tiny-llama does not split {comm.size} ways")
    assert_accounting_matches(one_step(QWEN, comm, sp))


# DeepSeek-V3's multi-head latent attention on the tiny Llama: query latent 24, KV latent 16,
# heads of 16 + 8 rotated dims, values of 12
MLA = dataclasses.replace(load_model_preset("tiny-llama").config, kv_heads=0, q_lora_rank=24,
                          kv_lora_rank=16, qk_rope_dim=8, v_head_dim=12)


@pytest.mark.parametrize("attention", ["baseline", "flash"])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("q_lora", [24, 0])
def test_latent_attention_accounting_equals_what_a_step_stores(attention: str, recompute: str,
                                                               q_lora: int) -> None:
    cfg = dataclasses.replace(MLA, attention=attention, q_lora_rank=q_lora)
    assert_accounting_matches(one_step(cfg, MPI.COMM_SELF, sp=False, recompute=recompute))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("sp", [False, True])
def test_latent_attention_accounting_matches_sharded_steps(sp: bool) -> None:
    """The latents and their norms on the rank's rows (its sequence shard under SP), the
    heads split over TP."""
    comm = MPI.COMM_WORLD
    if MLA.heads % comm.size or MLA.seq_len % comm.size:
        pytest.skip(f"tiny-llama does not split {comm.size} ways")
    assert_accounting_matches(one_step(MLA, comm, sp))


def korthikanti_bytes(s: int, b: int, h: int, a: int, t: int, sp: bool, mode: str) -> float:
    """Activation bytes per layer, Korthikanti et al. 2022 Table 2 (2-byte values, 1-byte
    dropout masks)."""
    if mode == "full":
        return 2 * s * b * h / (t if sp else 1)
    scores = 0 if mode == "selective" else 5 * a * s / h
    if sp:
        return s * b * h / t * (34 + scores)
    return s * b * h * (10 + 24 / t + scores / t)


@pytest.mark.parametrize("t", [1, 2, 8])
@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("mode", ["none", "selective", "full"])
def test_layer_activations_match_korthikanti_within_two_percent(t: int, sp: bool,
                                                                mode: str) -> None:
    """Table 2 of Korthikanti et al. 2022 for every mode; beyond it we keep only the fp32
    LayerNorm statistics (4 values per row, none under full recomputation)."""
    for name, b in (("mega-gpt2", 4), ("gpt3-175b", 1)):
        cfg = load_model_preset(name).config
        s, h, a = cfg.seq_len, cfg.hidden, cfg.heads
        d = make_dims(cfg, t, b, sp)
        ours = layer_stored(cfg, d, mode).bytes(2)
        published = korthikanti_bytes(s, b, h, a, t, sp and t > 1, mode)
        assert ours == pytest.approx(published, rel=0.02)
        stats = 0 if mode == "full" else 4 * d.shard_rows * 4
        assert ours == pytest.approx(published + stats, rel=1e-12)


@pytest.mark.parametrize("pp", [2, 4])
def test_1f1b_stage_i_holds_p_minus_i_micro_batches(pp: int) -> None:
    """Korthikanti et al. 2022 4.2.3 / Narayanan et al. 2021 2.2.1: under 1F1B the first
    stage keeps p micro-batches of activations, stage i keeps p - i; GPipe keeps all m."""
    cfg = dataclasses.replace(load_model_preset("mega-gpt2").config, layers=8)
    d = make_dims(cfg, 1, 1, False)
    one = layer_stored(cfg, d).bytes(2) * cfg.layers // pp
    m = 8
    for i in range(pp):
        lay = Layout(pp=pp, stage=i, micro_batches=m)
        edge = (embed_stored(cfg, d).bytes(2) if i == 0 else 0) + \
            (head_stored(cfg, d).bytes(2) if i == pp - 1 else 0)
        assert stage_activations(cfg, d, 2, lay).bytes(2) == (pp - i) * (one + edge)
        gpipe = stage_activations(cfg, d, 2, lay._replace(schedule="gpipe"))
        assert gpipe.bytes(2) == m * (one + edge)


def test_gpt3_175b_on_eight_h100_does_not_fit_and_tiny_does() -> None:
    cap = load_device("h100-sxm5").dram_capacity_bytes
    big = load_model_preset("gpt3-175b").config.for_tp(8)
    rep = memory_report(big, make_dims(big, 8, 2, False), 2, cap)
    assert not rep.fits and "does NOT fit" in rep.line()
    # 16 bytes per parameter of mixed-precision Adam: 2 + 2 + 4 (master) + 8 (m, v)
    n = rep.params_bytes / 2
    assert rep.params_bytes + rep.grads_bytes + rep.optimizer_bytes == pytest.approx(16 * n)
    tiny = TINY.for_tp(2)
    assert memory_report(tiny, make_dims(tiny, 2, 4, True), 2, cap).fits


@pytest.mark.parametrize("sets", [
    ["parallel.tp=1", "parallel.dp=2", "model.hidden=768", "model.layers=3",
     "model.seq_len=384"],
    ["parallel.tp=2", "parallel.dp=1", "model.hidden=1536", "model.layers=2",
     "model.seq_len=256", "parallel.sequence_parallel=true"],
    ["parallel.tp=2", "parallel.dp=1", "model.hidden=1024", "model.layers=2",
     "model.seq_len=256", "model.attention=flash"],
])
def test_host_estimate_is_within_20_percent_of_the_measured_peak(sets: list[str],
                                                                  tmp_path: Path) -> None:
    """Shapes the estimate's two calibrated counts were not fitted on (training/memory.py)."""
    import json
    from tests.conftest import run_mpi
    args = ["run", "workloads/quickstart.toml", "--set", "model.preset=tiny", "--set",
            "train.check_reference=false", "--set", "run.iterations=1", "--out",
            str(tmp_path)]
    for s in sets:
        args += ["--set", s]
    res = run_mpi(2, args, timeout=180)
    assert res.returncode == 0, res.stderr
    mem = json.loads((tmp_path / "manifest.json").read_text())["summary"]["host_memory"]
    ratio = mem["estimate_bytes"] / max(mem["peak_bytes"])
    assert 0.8 <= ratio <= 1.2, ratio


def megatron_weight_and_optimizer_bytes(cfg: ModelConfig, tp: int, pp: int, dp: int,
                                        distributed: bool) -> float:
    """Megatron-LM megatron/training/theoretical_memory_usage.py,
    `compute_weight_and_optimizer_memory` (GQA, SwiGLU's 3/2, RMSNorm without bias, untied
    embeddings), written out independently: the most loaded shard's parameters times 18
    bytes (bf16 weight, fp32 gradient, fp32 master + Adam m, v), or 6 + 12 / dp bytes with
    the distributed optimizer."""
    h, a, g = cfg.hidden, cfg.heads, cfg.groups
    norm = 1 if cfg.norm_kind == "rmsnorm" else 2
    glu = 3 / 2 if cfg.gated else 1
    q_ratio = cfg.head_dim * a / h
    attn = 2 * h * h * (1 + g / a) * q_ratio
    layer = 2 * h * (cfg.ffn_hidden * glu + norm) + attn
    emb = h * cfg.padded_vocab
    block = layer * cfg.layers + norm * h
    shard = (block / pp + emb) / tp
    if not cfg.tied_embeddings and pp == 1:
        shard += emb / tp
    return shard * (6 + 12 / dp if distributed else 18)


@pytest.mark.parametrize("name", ["llama3-8b", "llama3.1-70b", "mistral-7b", "llama2-13b"])
@pytest.mark.parametrize("tp, pp, dp, zero", [(1, 1, 8, 0), (2, 1, 4, 1), (8, 1, 1, 0),
                                              (4, 4, 8, 1), (8, 2, 16, 1)])
def test_llama_weights_and_optimizer_match_megatron_within_two_percent(
        name: str, tp: int, pp: int, dp: int, zero: int) -> None:
    """Parameters, the fp32 gradient buffer and the optimizer states of the first stage (the
    most loaded) against Megatron-LM's own estimate for these blocks; Megatron counts the
    final norm on every stage, the whole block's norm share (ours: where they sit)."""
    cfg = load_model_preset(name).config.for_tp(tp)
    d = make_dims(cfg, tp, 1, False)
    rep = memory_report(cfg, d, 2, 80e9, Layout(pp=pp, stage=0, dp=dp, zero=zero, grad_bytes=4))
    ours = rep.params_bytes + rep.grads_bytes + rep.optimizer_bytes
    published = megatron_weight_and_optimizer_bytes(cfg, tp, pp, dp, zero >= 1)
    assert ours == pytest.approx(published, rel=0.02)


@pytest.mark.parametrize("zero", [1, 2, 3])
@pytest.mark.parametrize("dp", [8, 64])
def test_zero_stages_match_the_zero_paper(zero: int, dp: int) -> None:
    """Rajbhandari et al. 2020, 5 and Fig. 1, fp16 weights and gradients, K = 12 bytes of
    optimizer state: (2 + 2) Psi + K Psi / N_d (stage 1), 2 Psi + (2 + K) Psi / N_d (2),
    (2 + 2 + K) Psi / N_d (3); beyond the paper's model states we count the buffers a
    sharded step holds whole: the layer being reduce-scattered (stage 2 and 3), and under
    stage 3 the layers gathered (the one computing and the prefetched next) and the
    embedding and head, which stay gathered."""
    cfg = load_model_preset("llama3-8b").config.for_tp(1)
    d = make_dims(cfg, 1, 1, False)
    rep = memory_report(cfg, d, 2, 80e9, Layout(dp=dp, zero=zero, grad_bytes=2))
    psi = cfg.param_count()
    unit = layer_param_count(cfg, 1)
    edge = psi - unit * cfg.layers
    paper = {1: 4 * psi + 12 * psi / dp, 2: 2 * psi + 14 * psi / dp, 3: 16 * psi / dp}[zero]
    buffers = {1: 0, 2: 2 * unit * (1 - 1 / dp),
               3: 2 * unit * (1 - 1 / dp) + (2 * unit + edge) * 2 * (1 - 1 / dp)}[zero]
    ours = rep.params_bytes + rep.grads_bytes + rep.optimizer_bytes
    assert ours - buffers == pytest.approx(paper, rel=1e-12)


def test_expert_tensor_parallelism_splits_the_experts_and_keeps_gathered_rows() -> None:
    """With ETP 2 a rank holds half of each of its experts' FFN (parameters, gradients and,
    sharded over an expert DP half as large, optimizer states the same) and keeps its
    expert-TP peers' rows it gathered: one more hidden-wide row per routed copy."""
    from mpiemu.training.memory import expert_param_count, moe_stored
    cfg = load_model_preset("tiny-moe").config
    d = make_dims(cfg, 1, 1, False)
    assert expert_param_count(cfg, 1, 2, etp=2) * 2 == expert_param_count(cfg, 1, 2)
    one, two = (memory_report(cfg, d, 2, 80e9, Layout(dp=4, ep=2, etp=etp, zero=1))
                for etp in (1, 2))
    x = expert_param_count(cfg, 1, 2) * (cfg.layers - cfg.moe.dense_layers)
    assert one.params_bytes - two.params_bytes == 2 * x / 2
    assert one.optimizer_bytes == pytest.approx(two.optimizer_bytes)  # half over half the EDP
    copies = d.shard_rows * cfg.moe.top_k
    assert moe_stored(cfg, d, 2).act - moe_stored(cfg, d).act == copies * cfg.hidden

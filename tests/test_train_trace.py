"""What a training run's trace shows: TP collectives per layer, DP buckets under backward,
the same schedule with and without numerics, and the per-iteration breakdown."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

from mpiemu.analysis import load
from mpiemu.analysis.breakdown import format_breakdown, run_breakdown
from mpiemu.analysis.rank_trace import RankTrace
from mpiemu.model.presets import load_model_preset
from mpiemu.model.tensor_parallel import local_params
from mpiemu.runner.job import run_workload

H, S, BATCH = 64, 16, 8      # the tiny preset
FWD_RS = {"proj.fwd", "fc2.fwd"}          # row-parallel GEMMs in forward
BWD_RS = {"fc1.bwd", "qkv.bwd"}           # input-gradient GEMMs of column-parallel layers
SP_AG = {"qkv.fwd", "fc1.fwd", "proj.bwd", "fc2.bwd",
         "qkv.bwd.regather", "fc1.bwd.regather"}   # Megatron SP gathers the input again


def grid() -> tuple[int, int]:
    n = MPI.COMM_WORLD.Get_size()
    return 2, n // 2


def train(out: Path, *extra: str) -> None:
    tp, dp = grid()
    sets = ["run.kind='train'", "run.iterations=2", f"parallel.tp={tp}", f"parallel.dp={dp}",
            "model.preset='tiny'", "run.emulated_dtype='fp16'", "train.dp_bucket_MiB=0.02",
            *extra]
    run_workload(None, sets, str(out), [], world=MPI.COMM_WORLD)
    MPI.COMM_WORLD.Barrier()        # every rank has closed its trace before anyone reads


def tp_collectives(rt: RankTrace, iteration: int) -> dict[int, dict[str, set[str]]]:
    """layer -> GEMM pair ('qkv.bwd') -> kinds of its collective spans ({'ar'}, {'rs'}, ...)."""
    ev = rt.events
    m = (rt.cats == "collective") & (rt.resources == "coll.tp") & (ev["iteration"] == iteration)
    out: dict[int, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for name, layer in zip(rt.names[m], ev["layer"][m]):
        if layer >= 0:
            stem, kind = name.rsplit(".", 1)
            out[int(layer)][stem.split(".", 1)[1]].add(kind)
    return out


def even_world() -> None:
    if MPI.COMM_WORLD.Get_size() % 2:
        pytest.skip("needs tp = 2 times a whole dp")


@pytest.mark.mpi(min_size=2)
def test_four_serialized_all_reduces_per_layer_of_h_sl_b_bytes(mpi_tmp_path: Path) -> None:
    even_world()
    train(mpi_tmp_path)
    run = load(mpi_tmp_path)
    _, dp = grid()
    for rt in run.ranks:
        per_layer = tp_collectives(rt, 1)
        assert sorted(per_layer) == [0, 1]
        for pairs in per_layer.values():
            assert set(pairs) == FWD_RS | BWD_RS          # after OP, FC-2 fwd; FC-1, QKV bwd
            assert all(k == {"ar"} for k in pairs.values())
        m = (rt.cats == "collective") & (rt.resources == "coll.tp") & (rt.events["layer"] >= 0)
        assert set(rt.events["bytes"][m]) == {2 * H * S * (BATCH // dp)}   # Eq. 5.5, fp16


@pytest.mark.mpi(min_size=2)
def test_sequence_parallel_replaces_each_all_reduce_by_a_reduce_scatter_and_all_gather(
        mpi_tmp_path: Path) -> None:
    even_world()
    train(mpi_tmp_path, "parallel.sequence_parallel=true")
    for rt in load(mpi_tmp_path).ranks:
        for pairs in tp_collectives(rt, 0).values():
            assert {p for p, k in pairs.items() if k == {"rs"}} == FWD_RS | BWD_RS
            assert {p for p, k in pairs.items() if k == {"ag"}} == SP_AG


def overlaps(a0: np.ndarray, a1: np.ndarray, b0: float, b1: float) -> bool:
    return bool(np.any((a0 < b1) & (a1 > b0)))


@pytest.mark.mpi(min_size=4)
def test_dp_buckets_overlap_the_rest_of_backward(mpi_tmp_path: Path) -> None:
    even_world()
    train(mpi_tmp_path)
    for rt in load(mpi_tmp_path).ranks:
        ev = rt.events
        bwd = (rt.cats == "compute") & (rt.phases == "bwd")
        buckets = np.char.startswith(rt.names.astype(str), "dp.bucket") & \
            (rt.cats == "collective")
        assert buckets.sum() >= 4
        hidden = [overlaps(ev["t_start"][bwd], ev["t_end"][bwd], s, e)
                  for s, e in zip(ev["t_start"][buckets], ev["t_end"][buckets])]
        assert sum(hidden) >= 2
        for b in run_breakdown(load(mpi_tmp_path))[rt.rank]:
            assert b.dp_exposed_s < b.dp_total_s


@pytest.mark.mpi(min_size=2)
def test_timing_only_runs_exactly_the_numerics_schedule(mpi_tmp_path: Path) -> None:
    even_world()
    runs = []
    for numerics in ("on", "off"):
        out = mpi_tmp_path / numerics
        train(out, f"run.numerics='{numerics}'", "parallel.sequence_parallel=true")
        runs.append(load(out))
    for a, b in zip(*(r.ranks for r in runs)):
        np.testing.assert_array_equal(a.names, b.names)
        np.testing.assert_array_equal(a.events["t_start"], b.events["t_start"])
        np.testing.assert_array_equal(a.events["t_end"], b.events["t_end"])
        np.testing.assert_array_equal(a.events["bytes"], b.events["bytes"])


@pytest.mark.mpi(min_size=2)
def test_breakdown_parts_add_up_to_the_iteration(mpi_tmp_path: Path) -> None:
    even_world()
    train(mpi_tmp_path)
    run = load(mpi_tmp_path)
    for per_rank in run_breakdown(run):
        assert [b.iteration for b in per_rank] == [0, 1]
        for b in per_rank:
            assert b.compute_s > 0 and b.tp_exposed_s > 0 and b.idle_s >= -1e-15
            total = b.compute_s + b.tp_exposed_s + b.dp_exposed_s + b.idle_s
            assert total == pytest.approx(b.iteration_s)
    assert len(format_breakdown(run)) == 3


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("fused", [False, True])
def test_every_micro_batch_adds_each_gradient_into_megatrons_buffer(
        mpi_tmp_path: Path, fused: bool) -> None:
    """Megatron's DDP hook: one `main_grad.add_` kernel (read gradient and buffer, write the
    buffer) per parameter and micro-batch; with accumulation fusion the layers' matrices are
    added by their weight-gradient GEMMs instead (C read: rows x cols x 2 more bytes)."""
    even_world()
    tp, dp = grid()
    micro = BATCH // dp // 2                                  # micro-batches of 2 sequences
    train(mpi_tmp_path, "train.micro_batch=2", f"train.grad_accumulation_fusion={str(fused).lower()}")
    sizes = {lp.name: lp for lp in local_params(load_model_preset("tiny").config, tp)}
    for rt in load(mpi_tmp_path).ranks:
        ev, it = rt.events, rt.events["iteration"] == 1
        hooks = it & np.char.endswith(rt.names.astype(str), ".grad_acc")
        added = defaultdict(list)
        for name, nbytes in zip(rt.names[hooks], ev["dram_bytes"][hooks]):
            added[str(name).removesuffix(".grad_acc")].append(float(nbytes))
        by_gemm = {n for n, lp in sizes.items() if lp.layer >= 0 and lp.decay}
        expect = set(sizes) - by_gemm if fused else set(sizes)
        assert set(added) == expect
        for name, got in added.items():
            # the tied table: the embedding's scatter and the LM head's GEMM (unfused) each
            hooks_per_micro = 2 if name == "wte" and not fused else 1
            assert got == [3.0 * 2 * sizes[name].size] * (micro * hooks_per_micro)


@pytest.mark.mpi(min_size=2)
def test_fused_accumulation_reads_the_buffer_in_the_weight_gradient_gemm(
        mpi_tmp_path: Path) -> None:
    even_world()
    tp, _ = grid()
    for fused in (False, True):
        train(mpi_tmp_path / str(fused), f"train.grad_accumulation_fusion={str(fused).lower()}")
    cfg = load_model_preset("tiny").config
    fc1 = H * cfg.ffn_hidden // tp                       # this rank's FC-1 weight elements
    runs = [load(mpi_tmp_path / str(f)).ranks[0] for f in (False, True)]
    wgrad = [float(rt.events["dram_bytes"][(rt.names == "l0.fc1.wgrad")
                                           & (rt.events["iteration"] == 1)][0]) for rt in runs]
    assert wgrad[1] - wgrad[0] == 2 * fc1


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("attention, mode", [("baseline", "fused"), ("baseline", "unfused"),
                                             ("flash", "fused")])
def test_megatron_attention_layout_copies_and_qkv_bias(mpi_tmp_path: Path, attention: str,
                                                       mode: str) -> None:
    """Around the batched attention GEMMs, Megatron's layout copies (context permute; the
    baddbmm alpha on dq / dk with fused kernels; the QKV split's concatenation); the QKV bias
    by its own kernel. Flash attention has no batched GEMMs, so no copies."""
    even_world()
    tp, dp = grid()
    train(mpi_tmp_path, f"model.attention='{attention}'", f"train.kernels='{mode}'")
    n = S * (BATCH // dp) * H // tp               # elements of this rank's q (or k, or v)
    expect = {} if attention == "flash" else {
        "attn.context.permute": 2 * n * 2, "attn.bwd.qkv.split": 2 * 3 * n * 2,
        **({"attn.bwd.dq.alpha": 2 * n * 2, "attn.bwd.dk.alpha": 2 * n * 2}
           if mode == "fused" else {})}
    expect["qkv.bias"] = 3 * n * 2 * 2 + 3 * H // tp * 2     # read output + bias, write
    for rt in load(mpi_tmp_path).ranks:
        it = (rt.events["iteration"] == 1) & (rt.events["layer"] == 0)
        named = {str(name).removeprefix("l0."): float(b)
                 for name, b in zip(rt.names[it], rt.events["dram_bytes"][it])}
        got = {k: v for k, v in named.items() if k in ("attn.context.permute", "qkv.bias",
                                                       "attn.bwd.qkv.split", "attn.bwd.dq.alpha",
                                                       "attn.bwd.dk.alpha")}
        assert got == expect


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_selective_recompute_clones_the_checkpointed_attention_input_gradients(
        mpi_tmp_path: Path, recompute: str) -> None:
    """Megatron's checkpointed attention core hands its q, k, v gradients over through
    AccumulateGrad, which copies each to the strided inputs' layout: three clones."""
    even_world()
    tp, dp = grid()
    train(mpi_tmp_path, f"train.recompute='{recompute}'")
    n = S * (BATCH // dp) * H // tp
    for rt in load(mpi_tmp_path).ranks:
        it = (rt.events["iteration"] == 1) & (rt.events["layer"] == 0)
        clones = {str(name): float(b) for name, b in zip(rt.names[it], rt.events["dram_bytes"][it])
                  if str(name).endswith(".checkpoint")}
        expect = {f"l0.attn.bwd.{x}.checkpoint": 2 * n * 2 for x in ("dq", "dk", "dv")}
        assert clones == (expect if recompute == "selective" else {})

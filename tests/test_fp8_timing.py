"""[fp8] recipes in the timing model: the transformer layers' linear GEMMs at the device's
FP8 rate, each recipe's casts as memory-bound kernels, the output layer in bf16."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mpiemu.analysis import load
from tests.conftest import our_lines, run_mpi

SLICE = ["--set", "run.emulated_dtype=bf16", "--set", "model.layers=2",
         "--set", "run.iterations=1"]
H100 = ["--set", "device.preset=h100-sxm5", "--set", "network.preset=dgx-h100", *SLICE]


def _events(tmp: Path, recipe: str) -> dict[str, float]:
    """Rank 0's total time per event name of a 2-layer GPT-3 175B slice at TP 8 (folded),
    and the iteration's time under `step`."""
    out = tmp / recipe
    res = run_mpi(1, ["run", "workloads/gpt3-175b-tp8.toml", *H100, "--set",
                      f"fp8.recipe='{recipe}'", "--out", str(out)])
    assert res.returncode == 0, res.stderr[-1000:]
    run = load(out)
    rt = run.ranks[0]
    dur = rt.events["t_end"] - rt.events["t_start"]
    names = rt.names
    ev = {str(n): float(dur[names == n].sum()) for n in np.unique(names)}
    it = run.manifest["summary"]["iterations"][0]
    return ev | {"step": it["t_end"] - it["t_start"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, float]]:
    tmp = tmp_path_factory.mktemp("fp8")
    return {r: _events(tmp, r) for r in ("off", "delayed", "current", "block")}


def test_layer_gemms_run_at_the_fp8_rate_and_the_output_layer_does_not(
        runs: dict[str, dict[str, float]]) -> None:
    off, fp8 = runs["off"], runs["delayed"]
    for gemm in ("l0.fc1.fwd.gemm", "l0.fc2.fwd.gemm", "l0.qkv.fwd.gemm", "l1.fc1.wgrad"):
        assert fp8[gemm] < 0.75 * off[gemm], gemm          # 2x the peak, minus tile effects
    heads = [n for n in off if n.startswith("head.") and "gemm" in n]
    assert heads and all(fp8[n] == off[n] for n in heads)


def test_each_recipe_adds_its_casts(runs: dict[str, dict[str, float]]) -> None:
    """fprop casts x and W, dgrad casts dy, wgrad reuses them; current reads each source
    twice (its amax pass) where delayed reads it once; block reads activations twice."""
    casts = {r: {n: t for n, t in ev.items() if ".fp8.cast_" in n} for r, ev in runs.items()}
    assert not casts["off"]
    d = casts["delayed"]
    assert {"l0.fc1.fwd.gemm.fp8.cast_x", "l0.fc1.fwd.gemm.fp8.cast_w",
            "l0.fc2.bwd.gemm.fp8.cast_dy"} <= set(d)
    assert not any("wgrad" in n for n in d)
    total = {r: sum(c.values()) for r, c in casts.items()}
    assert total["delayed"] < total["block"] < total["current"]


def test_fp8_shortens_the_step_and_recipes_order_by_their_casts(
        runs: dict[str, dict[str, float]]) -> None:
    """The layer GEMMs take the same time under every recipe; the step differs by the
    recipe's casts (delayed the cheapest) and is shorter than in bf16."""
    gemm = {r: sum(t for n, t in ev.items() if n[0] == "l" and
                   (n.endswith("gemm") or n.endswith("wgrad"))) for r, ev in runs.items()}
    assert gemm["delayed"] < 0.75 * gemm["off"]
    assert gemm["current"] == pytest.approx(gemm["delayed"], rel=1e-12)
    assert gemm["block"] == pytest.approx(gemm["delayed"], rel=1e-12)
    step = {r: ev["step"] for r, ev in runs.items()}
    assert step["delayed"] < step["block"] < step["current"] < step["off"]


@pytest.mark.parametrize("sets, needle", [
    (["--set", "device.preset=a100-sxm4-80gb", "--set", "network.preset=dgx-a100",
      "--set", "fp8.recipe='delayed'"], "no FP8 tensor cores"),
    (["--set", "fp8.recipe='mxfp8'"], "fp8.recipe"),
    (["--set", "fp8.recipe='delayed'", "--set", "fp8.amax_history_len=0"],
     "fp8.amax_history_len"),
    (["--set", "run.emulated_dtype='fp8'"], "run.emulated_dtype"),
])
def test_fp8_bad_input_is_one_line(sets: list[str], needle: str, tmp_path: Path) -> None:
    base = SLICE if any("a100" in s for s in sets) else H100
    res = run_mpi(1, ["run", "workloads/gpt3-175b-tp8.toml", *base, *sets,
                      "--out", str(tmp_path)])
    lines = our_lines(res.stderr)
    assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr, lines
    assert needle in lines[0], lines


def test_fp8_numerics_in_fp64_are_refused_in_one_line(tmp_path: Path) -> None:
    """FP8 numerics keep the other tensors in bf16 or fp32 (the quickstart's are fp64)."""
    res = run_mpi(2, ["run", "workloads/quickstart.toml", "--set", "parallel.dp=1",
                      "--set", "device.preset=h100-sxm5",
                      "--set", "network.preset=dgx-h100", "--set", "run.emulated_dtype=bf16",
                      "--set", "fp8.recipe='current'", "--out", str(tmp_path)])
    lines = our_lines(res.stderr)
    assert res.returncode == 2 and len(lines) == 1 and "run.numeric_dtype='fp64'" in lines[0]


def test_fp8_keeps_two_fp8_copies_of_each_layer_weight() -> None:
    """Transformer Engine's rowwise and columnwise FP8 copies: 2 bytes more per parameter
    of the layers (not of the embedding or the output layer), held whole."""
    from mpiemu.config.workload import load_workload
    from mpiemu.runner.train_setup import train_memory
    from mpiemu.training.memory import layer_param_count
    base = ["device.preset='h100-sxm5'", "network.preset='dgx-h100'", "run.numerics='off'",
            "run.emulated_dtype='bf16'", "model.layers=4"]
    w0 = load_workload("workloads/gpt3-175b-tp8.toml", base)
    w8 = load_workload("workloads/gpt3-175b-tp8.toml", [*base, "fp8.recipe='delayed'"])
    m0, m8 = train_memory(w0, 80e9, 0), train_memory(w8, 80e9, 0)
    from mpiemu.runner.train_setup import resolve
    cfg, _, _ = resolve(w0)
    assert m8.params_bytes - m0.params_bytes == 2 * 4 * layer_param_count(cfg, 8)


def test_fp8_parameters_are_held_and_gathered_in_fp8(tmp_path: Path) -> None:
    """optimizer.fp8_param_gather: a layer's weights are held as FP8 (their rowwise copy;
    the columnwise one stays), and the distributed optimizer's and FSDP's parameter
    all-gathers move a layer weight in one byte; the embedding and the norms in two."""
    from mpiemu.config.workload import load_workload
    from mpiemu.runner.train_setup import resolve, train_memory
    from mpiemu.training.memory import layer_param_count
    base = ["device.preset='h100-sxm5'", "network.preset='dgx-h100'", "run.numerics='off'",
            "run.emulated_dtype='bf16'", "model.layers=4", "fp8.recipe='delayed'",
            "optimizer.zero=1"]
    w0 = load_workload("workloads/gpt3-175b-tp8.toml", base)
    w8 = load_workload("workloads/gpt3-175b-tp8.toml", [*base, "optimizer.fp8_param_gather=true"])
    cfg, _, _ = resolve(w0)
    m0, m8 = train_memory(w0, 80e9, 0), train_memory(w8, 80e9, 0)
    assert m0.params_bytes - m8.params_bytes == 2 * 4 * layer_param_count(cfg, 8)
    sent = {}
    for zero in (1, 3):
        for fp8 in (False, True):
            out = tmp_path / f"z{zero}-{fp8}"
            res = run_mpi(2, ["run", "workloads/quickstart.toml", "--set", "parallel.tp=1",
                              "--set", "run.numerics='off'", "--set",
                              "device.preset='h100-sxm5'", "--set", "network.preset='dgx-h100'",
                              "--set", "run.emulated_dtype='bf16'", "--set",
                              "fp8.recipe='delayed'", "--set", f"optimizer.zero={zero}",
                              "--set", f"optimizer.fp8_param_gather={str(fp8).lower()}",
                              "--set", "train.check_reference=false", "--set",
                              "run.iterations=1", "--out", str(out)])
            assert res.returncode == 0, res.stderr[-1000:]
            ev = load(out).ranks[0].events
            names = load(out).ranks[0].names
            gathers = np.char.startswith(names.astype(str), "dp.param_")
            sent[(zero, fp8)] = float(ev["bytes"][gathers].sum())
    from mpiemu.model.tensor_parallel import local_params
    from mpiemu.training.fully_sharded import fp8_param
    qs = load_workload("workloads/quickstart.toml", ["parallel.tp=1"])
    specs = list(local_params(resolve(qs)[0], 1))
    for zero in (1, 3):       # ZeRO-3 gathers a layer twice (forward, backward), the rest once
        times = [2 if zero == 3 and lp.layer >= 0 else 1 for lp in specs]
        fp8 = sum(t * lp.size * (1 if fp8_param(lp) else 2) for t, lp in zip(times, specs))
        bf16 = sum(t * lp.size * 2 for t, lp in zip(times, specs))
        assert sent[(zero, True)] / sent[(zero, False)] == pytest.approx(fp8 / bf16, rel=0.01)


@pytest.mark.parametrize("sets, needle", [
    (["optimizer.zero=0", "fp8.recipe='delayed'"], "optimizer.zero"),
    (["optimizer.zero=1"], "without an [fp8] recipe"),
])
def test_fp8_param_gather_refused_without_its_needs(sets: list[str], needle: str,
                                                     tmp_path: Path) -> None:
    res = run_mpi(1, ["run", "workloads/gpt3-175b-tp8.toml", *H100, "--set",
                      "optimizer.fp8_param_gather=true",
                      *[a for s in sets for a in ("--set", s)], "--out", str(tmp_path)])
    lines = our_lines(res.stderr)
    assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr, lines
    assert "optimizer.fp8_param_gather" in lines[0] and needle in lines[0], lines


def test_experts_grouped_gemms_run_in_fp8_and_weights_are_cast_once_a_step(
        tmp_path: Path) -> None:
    """Timing only, an MoE model: the experts' grouped GEMMs at the FP8 rate with their
    casts (every expert's weight of the rank in one), and each layer weight cast at the
    first of the step's micro-batches only (TE's cached FP8 weights)."""
    def run(recipe: str) -> tuple[dict[str, float], dict[str, int]]:
        out = tmp_path / recipe
        res = run_mpi(2, ["run", "workloads/quickstart.toml", "--set", "model.preset='tiny-moe'",
                          "--set", "parallel.tp=1", "--set", "parallel.ep=2", "--set",
                          "run.numerics='off'", "--set", "train.check_reference=false",
                          "--set", "device.preset='h100-sxm5'", "--set",
                          "network.preset='dgx-h100'", "--set", "run.emulated_dtype='bf16'",
                          "--set", "optimizer.zero=0", "--set", "train.global_batch=8",
                          "--set", "train.micro_batch=2", "--set", "run.iterations=2",
                          "--set", "model.hidden=1024", "--set", "model.seq_len=1024",
                          "--set", "moe.expert_ffn=2048",
                          "--set", f"fp8.recipe='{recipe}'", "--out", str(out)])
        assert res.returncode == 0, res.stderr[-1500:]
        rt = load(out).ranks[0]
        names = rt.names.astype(str)
        dur = rt.events["t_end"] - rt.events["t_start"]
        return ({n: float(dur[names == n].sum()) for n in np.unique(names)},
                {n: int((names == n).sum()) for n in np.unique(names)})
    (off, _), (fp8, count) = run("off"), run("delayed")
    assert fp8["l0.experts.fc1.fwd"] < 0.75 * off["l0.experts.fc1.fwd"]
    assert count["l0.experts.fc1.fwd.fp8.cast_x"] == 2 * 2          # 2 micro-batches x 2 steps
    assert count["l0.experts.fc1.fwd.fp8.cast_w"] == 2              # once a step
    assert count["l0.qkv.fwd.gemm.fp8.cast_w"] == 2
    assert not any(n.startswith("l0.router.") and "fp8" in n for n in count)   # bf16
    assert fp8["l0.router.fwd"] == off["l0.router.fwd"]


def test_fp8_keeps_linear_inputs_as_fp8_copies() -> None:
    """Under an FP8 recipe a dense layer keeps its QKV, FC-1 and FC-2 inputs as FP8 copies
    (one byte instead of two) and the attention output's FP8 copy beside it."""
    from mpiemu.config.workload import load_workload
    from mpiemu.runner.train_setup import resolve, train_memory
    base = ["device.preset='h100-sxm5'", "network.preset='dgx-h100'", "run.numerics='off'",
            "run.emulated_dtype='bf16'", "model.layers=4"]
    w0 = load_workload("workloads/gpt3-175b-tp8.toml", base)
    w8 = load_workload("workloads/gpt3-175b-tp8.toml", [*base, "fp8.recipe='delayed'"])
    _, _, d = resolve(w0)
    m0, m8 = train_memory(w0, 80e9, 0), train_memory(w8, 80e9, 0)
    per_layer = 2 * d.shard_rows * d.hidden + d.rows * d.ffn - d.rows * d.attn_width
    assert m0.activations_bytes - m8.activations_bytes == 4 * per_layer


def test_sequence_parallel_gathers_move_fp8_bytes(tmp_path: Path) -> None:
    """Under SP and an FP8 recipe the column-parallel inputs (forward, the backward's
    re-gather, a row-parallel layer's dy) are cast on the rank's shard and all-gathered in
    one byte a value, half of bf16's; a row-parallel backward casts dy, not x and W."""
    def gathers(recipe: str) -> tuple[dict[str, int], set[str]]:
        out = tmp_path / recipe
        res = run_mpi(2, ["run", "workloads/quickstart.toml", "--set", "parallel.dp=1",
                          "--set", "parallel.sequence_parallel=true", "--set",
                          "run.numerics='off'", "--set", "train.check_reference=false",
                          "--set", "device.preset='h100-sxm5'", "--set",
                          "network.preset='dgx-h100'", "--set", "run.emulated_dtype='bf16'",
                          "--set", f"fp8.recipe='{recipe}'", "--set", "run.iterations=1",
                          "--out", str(out)])
        assert res.returncode == 0, res.stderr[-1000:]
        rt = load(out).ranks[0]
        names = rt.names.astype(str)
        return ({n: int(rt.events["bytes"][names == n].sum()) for n in set(names)
                 if n.startswith("l0.") and n.endswith(".ag")}, set(names))
    (off, _), (fp8, names) = gathers("off"), gathers("delayed")
    assert set(off) == set(fp8) == {"l0.qkv.fwd.ag", "l0.qkv.bwd.regather.ag", "l0.fc1.fwd.ag",
                                    "l0.fc1.bwd.regather.ag", "l0.fc2.bwd.ag", "l0.proj.bwd.ag"}
    assert all(2 * fp8[n] == off[n] for n in off)
    assert "l0.fc2.bwd.fp8.cast_dy" in names and "l0.fc2.bwd.fp8.cast_x" not in names

"""FP8 numerics in a training step (`precision.fp8_gemm`): the sharded run against the
one-process reference under each recipe at (tp, pp, dp) = (2, 1, 1), (1, 2, 1), (2, 2, 2),
within the bounds `runner.train_setup.reference_tolerance` states; a TP shard's GEMMs
bitwise equal to the unsharded GEMM's slice; emulated times as without numerics."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from mpiemu.precision.fp8_gemm import RECIPES, Fp8Gemm, Fp8Recipe
from tests.conftest import our_lines, run_mpi

# a small Llama whose every GEMM width is a multiple of 128 (block scaling's tiles) at TP 2:
# 4 query heads of 128 and 2 KV heads (per rank: q 256, k 128, v 128), FFN 512 (256 per
# rank), 128-token sequences, one sequence per micro-batch
MODEL = ["model.preset='tiny-llama'", "model.hidden=256", "model.heads=4", "model.kv_heads=2",
         "model.kv_channels=128", "model.ffn_hidden=512", "model.seq_len=128",
         "train.global_batch=4", "train.micro_batch=1"]
H100 = ["device.preset='h100-sxm5'", "network.preset='dgx-h100'", "run.emulated_dtype='bf16'"]
LAYOUTS = [(2, 1, 1), (1, 2, 1), (2, 2, 2)]


def _run(tmp: Path, layout: tuple[int, int, int], recipe: str, dtype: str,
         *extra: str) -> dict[str, Any]:
    tp, pp, dp = layout
    sets = [*MODEL, *H100, f"parallel.tp={tp}", f"parallel.pp={pp}", f"parallel.dp={dp}",
            "run.iterations=3", f"run.numeric_dtype='{dtype}'", f"fp8.recipe='{recipe}'",
            *extra]
    res = run_mpi(tp * pp * dp, ["run", "workloads/quickstart.toml",
                                 *[a for s in sets for a in ("--set", s)], "--quiet",
                                 "--out", str(tmp)], timeout=300)
    assert res.returncode == 0, res.stdout[-1500:] + res.stderr[-1500:]
    summary: dict[str, Any] = json.loads((tmp / "manifest.json").read_text())["summary"]
    return summary


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("recipe", RECIPES)
def test_bf16_fp8_run_matches_the_fp8_reference(layout: tuple[int, int, int], recipe: str,
                                                tmp_path: Path) -> None:
    """Transformer Engine's configuration: bf16 tensors, FP8 GEMMs. Iteration 0's gradients
    within FP8's noise (2**-2) of the reference's; the losses, averaged over every token,
    much closer; the drift from float64 reported with the recipe named."""
    s = _run(tmp_path, layout, recipe, "bf16")
    ref, drift = s["reference"], s["drift"]
    assert ref["passed"] and ref["tolerance"] == 2.0 ** -2, ref
    assert ref["loss_rel_err"] < 2.0 ** -7
    assert [r["iteration"] for r in drift["iterations"]] == [0, 1, 2]
    # FP8's effect on the first gradients: far above bf16's (at most 2**-6, bf16 runs)
    assert drift["first_grads"]["median"] > 2.0 ** -5


@pytest.mark.parametrize("layout", LAYOUTS)
def test_block_scaling_with_fp32_outputs_matches_to_fp32_rounding(
        layout: tuple[int, int, int], tmp_path: Path) -> None:
    """With fp32 outputs the two runs differ by fp32 summation orders only, and the
    power-of-2 tile scales do not move with them: 2**-10, the median tensor to fp32
    rounding."""
    ref = _run(tmp_path, layout, "block", "fp32")["reference"]
    assert ref["passed"] and ref["tolerance"] == 2.0 ** -10, ref
    assert ref["grad_median_rel_err"] < 2.0 ** -20


def test_fp8_numerics_do_not_change_emulated_time(tmp_path: Path) -> None:
    on = _run(tmp_path / "on", (2, 1, 1), "delayed", "bf16")["iterations"]
    off = _run(tmp_path / "off", (2, 1, 1), "delayed", "bf16", "run.numerics='off'",
               "train.check_reference=false")["iterations"]
    assert [(i["t_start"], i["t_end"]) for i in on] == [(i["t_start"], i["t_end"]) for i in off]


def _exchange(shards: list[Callable[[Callable[[np.ndarray], np.ndarray]], list[np.ndarray]]]
              ) -> list[list[np.ndarray]]:
    """Run each shard's calls twice: first recording the amaxes it reduces, then with each
    reduction answered by the MAX over the shards (an all-reduce, emulated in order)."""
    seen: list[list[np.ndarray]] = [[] for _ in shards]
    for r, run in enumerate(shards):
        run(lambda x, r=r: seen[r].append(x.copy()) or x)       # type: ignore[func-returns-value]
    out = []
    for run in shards:
        calls = iter(range(len(seen[0])))

        def reduce(x: np.ndarray) -> np.ndarray:
            k = next(calls)
            return np.maximum.reduce([s[k] for s in seen])
        out.append(run(reduce))
    return out


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_column_shard_equals_the_unsharded_gemm_bitwise(recipe: str) -> None:
    """Column-parallel: each TP rank's fprop and wgrad are the unsharded GEMM's columns,
    bit for bit, over two steps (the delayed scales from the amaxes reduced over TP)."""
    rng = np.random.default_rng(5)
    x, dy = rng.standard_normal((128, 256)), rng.standard_normal((128, 512)) * 1e-3
    w = rng.standard_normal((256, 512)) * 0.02
    cols = [slice(0, 256), slice(256, 512)]

    def steps(g: Fp8Gemm, c: slice) -> list[np.ndarray]:
        outs = []
        for step in range(2):
            g.new_step()
            outs.append(g("fc1", x * (1 + step), w[:, c]))
            g.end_pass(backward=False)
            outs.append(g.accumulate("fc1", x.T, dy[:, c]))
            g.end_pass(backward=True)
        return outs

    def shard(c: slice) -> Callable[[Callable[[np.ndarray], np.ndarray]], list[np.ndarray]]:
        return lambda reduce: steps(Fp8Gemm(Fp8Recipe(recipe, amax_history_len=4), reduce), c)
    whole = steps(Fp8Gemm(Fp8Recipe(recipe, amax_history_len=4)), slice(0, 512))
    parts = _exchange([shard(c) for c in cols])
    for k, want in enumerate(whole):
        assert np.array_equal(np.concatenate([p[k] for p in parts], axis=1), want), k


@pytest.mark.parametrize("extra, needle", [
    (["run.numeric_dtype='fp16'"], "run.numeric_dtype='fp16'"),
    (["train.recompute='full'"], "train.recompute = 'full'"),
    (["model.preset='tiny-moe'", "parallel.tp=1", "parallel.dp=2", "parallel.ep=2",
      "optimizer.zero=0", "run.numeric_dtype='fp32'"], "with experts"),
])
def test_fp8_numerics_refused_where_not_modelled(extra: list[str], needle: str,
                                                 tmp_path: Path) -> None:
    sets = [*H100, "parallel.tp=2", "parallel.dp=1", "run.numeric_dtype='bf16'",
            "fp8.recipe='delayed'", *extra]
    res = run_mpi(2, ["run", "workloads/quickstart.toml",
                      *[a for s in sets for a in ("--set", s)], "--out", str(tmp_path)])
    lines = our_lines(res.stderr)
    assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr, lines
    assert "fp8.recipe" in lines[0] and needle in lines[0], lines


@pytest.mark.parametrize("zero", [1, 3])
def test_fp8_parameters_cast_from_the_master_weights(zero: int, tmp_path: Path) -> None:
    """optimizer.fp8_param_gather: the weights are cast to FP8 from the fp32 master shards
    (not from a bf16 copy), in the run and in its reference alike; the losses move."""
    base = ["run.iterations=3", f"optimizer.zero={zero}"]
    s8 = _run(tmp_path / "fp8", (1, 1, 2), "delayed", "bf16", *base,
              "optimizer.fp8_param_gather=true")
    s16 = _run(tmp_path / "bf16", (1, 1, 2), "delayed", "bf16", *base)
    assert s8["reference"]["passed"] and s16["reference"]["passed"]
    assert [i["loss"] for i in s8["iterations"]] != [i["loss"] for i in s16["iterations"]]


@pytest.mark.parametrize("extra", [
    ["parallel.sequence_parallel=true"],                       # inputs all-gathered (SP)
    ["parallel.tp=1", "parallel.cp=2", "model.attention='flash'"],   # the sequence over CP
])
def test_fp8_with_sequence_and_context_parallelism(extra: list[str], tmp_path: Path) -> None:
    """Under SP a column-parallel GEMM casts the all-gathered input; under CP each rank
    holds two chunks of every sequence and the amaxes are reduced over CP too."""
    s = _run(tmp_path, (2, 1, 1), "current", "bf16", "model.seq_len=256", *extra)
    assert s["reference"]["passed"], s["reference"]

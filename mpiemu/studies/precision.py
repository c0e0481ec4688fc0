"""`mpiemu report precision`: the same small models trained in fp64, fp32, bf16, fp16 and
bf16 with each FP8 recipe, with real numerics, same data and seed (the loss each precision
reaches, step by step), and the step time of a published configuration in BF16 and under
each FP8 recipe on H100s.

1. For each model of `precision.toml [models]` and each of `[precisions]` (a numeric dtype,
   or bf16 with an FP8 recipe): one `mpiemu run` of `[steps]` steps over
   `workloads/quickstart.toml` with `[layout]`: every step's loss, and under fp16 its loss
   scale and whether the step was skipped (`losses.csv`).
2. The llama study's `[timing_row]` emulated timing only in BF16 and under each FP8 recipe
   (`timing.csv`), its FP8 twin's measured speedup beside ours.
Golden test: the first `[golden]` steps of one run.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from . import runs as launch
from ..precision.fp8_gemm import RECIPES
from ..workloads import DIR as WORKLOADS_DIR
from .common import Golden, Row, load_figures

STUDY = "precision"
WORKLOAD = WORKLOADS_DIR / "quickstart.toml"


def figures() -> dict[str, Any]:
    return {k: f.value for k, f in load_figures(STUDY).items()}


def precision_sets(name: str) -> list[str]:
    """A precision's overrides: a numeric dtype, or `fp8-<recipe>` (bf16 tensors, the
    layers' linear GEMMs in FP8 under the recipe)."""
    if name.startswith("fp8-"):
        return ["run.numeric_dtype='bf16'", f"fp8.recipe='{name[4:]}'"]
    return [f"run.numeric_dtype='{name}'"]


def loss_rows(runs: Path, steps: int | None = None,
              only: tuple[str, str] | None = None) -> list[Row]:
    """Every step of every (model, precision) run (`only`: one of them)."""
    fig = figures()
    steps = steps or int(fig["steps"])
    out: list[Row] = []
    for m in fig["models"]:
        for dtype in fig["precisions"]:
            if only and (m["name"], dtype) != only:
                continue
            where = runs / f"{m['name']}-{dtype}"
            launch.run(1, WORKLOAD, [*fig["layout"], *m["sets"], f"run.iterations={steps}",
                                     *precision_sets(dtype)], where)
            summary = json.loads((where / "manifest.json").read_text())["summary"]
            for r in summary["iterations"]:
                out.append({"model": m["name"], "precision": dtype,
                            "iteration": r["iteration"], "loss": r["loss"],
                            "loss_scale": r.get("loss_scale"), "skipped": r.get("skipped")})
    return out


def timing_rows(runs: Path) -> list[Row]:
    """The published row's step time in BF16 and under each FP8 recipe, and the measured
    FP8 / BF16 speedup of its twin."""
    from . import llama  # noqa: PLC0415
    row_id = str(figures()["timing_row"])
    workload = llama.write_workload(runs)
    row = next(r for r in llama.measured() if r["id"] == row_id)
    twin = next(r for r in llama.fp8_measured() if llama.bf16_twin(str(r["id"])) == row_id)
    theirs = {"bf16": llama.measured_step(row, workload),
              "fp8": llama.measured_step(twin, workload)}
    plan = llama.plan(row, workload)
    out: list[Row] = []
    for recipe in ("off", *RECIPES):
        where = runs / f"timing-{recipe}"
        extra = [] if recipe == "off" else llama.fp8_sets(twin, plan.sets, recipe)
        launch.run(plan.processes, workload, [*plan.sets, *extra], where)
        it = json.loads((where / "manifest.json").read_text())["summary"]["iterations"][0]
        out.append({"row": row_id, "gpus": row["gpus"], "precision":
                    "bf16" if recipe == "off" else f"fp8-{recipe}",
                    "ours_step_s": float(it["t_end"] - it["t_start"]),
                    "measured_step_s": theirs["bf16" if recipe == "off" else "fp8"]
                    if recipe in ("off", llama.fp8_recipe(twin)) else None})
    base = out[0]["ours_step_s"]
    for r in out:
        r["ours_speedup"] = base / r["ours_step_s"]
        r["measured_speedup"] = None if r["measured_step_s"] is None else \
            theirs["bf16"] / r["measured_step_s"]
    return out


def golden() -> list[Golden]:
    g = figures()["golden"]
    with tempfile.TemporaryDirectory(prefix="mpiemu-precision-") as tmp:
        rows = loss_rows(Path(tmp), int(g["steps"]), (g["model"], g["precision"]))
    return [Golden("losses.csv", rows, lambda r: r["model"] == g["model"] and
                   r["precision"] == g["precision"] and int(r["iteration"]) < int(g["steps"]))]

"""`main`, README and plot of `mpiemu report precision` (`precision.py` runs the jobs): every
number in the prose comes from the rows (none typed here)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Sequence

import numpy as np

from . import precision
from .common import (Row, load_figures, md_table, out_dir_of, plt, runs_dir, signed_pct,
                     study_args, study_parser, write_csv)

PNG = "losses.png"


def _curve(rows: Sequence[Row], model: str, dtype: str) -> np.ndarray:
    return np.array([float(r["loss"]) for r in rows
                     if r["model"] == model and r["precision"] == dtype])


def loss_table(rows: Sequence[Row]) -> list[str]:
    """Per model and precision: the last quarter's mean loss, its difference from fp64's,
    the largest per-step difference, fp16's skipped steps and last loss scale."""
    fig = precision.figures()
    out = []
    for m in fig["models"]:
        exact = _curve(rows, m["name"], "fp64")
        q = len(exact) * 3 // 4
        for dtype in fig["precisions"]:
            c = _curve(rows, m["name"], dtype)
            mine = [r for r in rows if r["model"] == m["name"] and r["precision"] == dtype]
            skipped = sum(bool(r["skipped"]) for r in mine if r["skipped"] is not None)
            scale = mine[-1]["loss_scale"]
            out.append([m["name"], dtype, f"{c[0]:.4f} -> {c[-1]:.4f}", f"{c[q:].mean():.5f}",
                        signed_pct(c[q:].mean() / exact[q:].mean() - 1, 3),
                        f"{np.abs(c / exact - 1).max():.2e}",
                        skipped if dtype == "fp16" else "-",
                        f"{scale:.0f}" if scale is not None else "-"])
    return md_table(["model", "precision", "loss first -> last", "last quarter mean",
                     "vs fp64", "largest step difference", "skipped steps", "last loss scale"],
                    out, "llrrrrrr")


def timing_table(rows: Sequence[Row]) -> list[str]:
    return md_table(["precision", "ours step s", "ours speedup", "measured step s",
                     "measured speedup", "difference"],
                    [[r["precision"], f"{r['ours_step_s']:.3f}", f"{r['ours_speedup']:.3f}x",
                      "-" if r["measured_step_s"] is None else f"{r['measured_step_s']:.2f}",
                      "-" if r["measured_speedup"] is None else f"{r['measured_speedup']:.3f}x",
                      "-" if r["measured_speedup"] is None else
                      signed_pct(r["ours_speedup"] / r["measured_speedup"] - 1)]
                     for r in rows], "lrrrrr")


def side_by_side(losses: Sequence[Row], timing: Sequence[Row]) -> list[str]:
    """Each precision with both: what it does to the loss (each model's last quarter
    against fp64's) and its emulated H100 speedup over BF16 at the published size."""
    fig = precision.figures()
    out = []
    for t in timing:
        cells = []
        for m in fig["models"]:
            exact, c = _curve(losses, m["name"], "fp64"), _curve(losses, m["name"],
                                                                 t["precision"])
            q = len(exact) * 3 // 4
            cells.append(signed_pct(c[q:].mean() / exact[q:].mean() - 1, 3) if len(c) else "-")
        out.append([t["precision"], *cells, f"{t['ours_speedup']:.3f}x"])
    return md_table(["precision", *(f"{m['name']}: loss vs fp64" for m in fig["models"]),
                     "H100 speedup (ours)"], out, "l" + "r" * (len(fig["models"]) + 1))


def markdown(losses: Sequence[Row], timing: Sequence[Row], wall_s: float) -> list[str]:
    fig = load_figures("precision")
    return ["# Precision: what each numeric format does to training, and what FP8 saves", "",
            "Regenerate: `mpiemu report precision` (`mpiemu/studies/precision.py`, setup in "
            f"`precision.toml`), {wall_s:.0f} s on this machine. Same models, data and seed "
            "in every precision; real numerics on one process each.", "",
            "## Losses", "", f"{1 + max(int(r['iteration']) for r in losses)} steps each; "
            "models: "
            f"{fig['models'].source}; precisions: {fig['precisions'].source}.", "",
            *loss_table(losses), "",
            "`vs fp64`: the last quarter's mean loss over fp64's, - 1; largest step "
            "difference: max over steps of |loss / fp64's loss - 1|.", "",
            f"![loss curves]({PNG})", "",
            "## Step time at a published size", "", f"{fig['timing_row'].source}.", "",
            *timing_table(timing), "",
            "The measured FP8 step is its row's recipe (delayed scaling, llama.toml "
            "[fp8_recipes]); speedup = BF16 step / step.", "",
            "## Side by side", "",
            "What each precision does to the small models' loss (last quarter, against fp64) "
            "beside the step time it would save on H100s at the published size.", "",
            *side_by_side(losses, timing), ""]


def plot(rows: Sequence[Row], path: Path) -> None:
    """Per model: the loss per step (top) and its difference from fp64's, as a running mean
    over 20 steps (bottom, symmetric-log: the curves above overlap)."""
    fig_ = precision.figures()
    pyplot = plt()
    models = fig_["models"]
    fig, axes = pyplot.subplots(2, len(models), figsize=(12, 8), squeeze=False)
    for j, m in enumerate(models):
        exact = _curve(rows, m["name"], "fp64")
        for dtype in fig_["precisions"]:
            c = _curve(rows, m["name"], dtype)
            axes[0][j].plot(c, label=dtype, lw=1)
            diff = np.convolve(c / exact - 1, np.ones(20) / 20, mode="valid")
            axes[1][j].plot(np.arange(len(diff)) + 19, 100 * diff, label=dtype, lw=1)
        axes[0][j].set_title(f"{m['name']}: loss per step")
        axes[1][j].set_title(f"{m['name']}: loss vs fp64, running mean of 20 steps")
        axes[1][j].set_ylabel("% difference (linear within +-0.5)")
        axes[1][j].set_yscale("symlog", linthresh=0.5)   # fp16's early lag beside the rest
        for ax in axes[:, j]:
            ax.set_xlabel("step")
            ax.legend(fontsize=8)
        axes[0][j].set_ylabel("loss")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot.close(fig)


def main(out_dir: Path, argv: list[str]) -> int:
    ap = study_parser("precision", precision.__doc__, raw=True)
    ap.add_argument("--steps", type=int, help="steps per run (default: the toml's)")
    args = study_args(ap, argv)
    out_dir = out_dir_of(args, out_dir)
    t0 = time.perf_counter()
    with runs_dir(args, "mpiemu-precision-") as runs:
        losses = precision.loss_rows(runs, args.steps)
        timing = precision.timing_rows(runs)
    wall = time.perf_counter() - t0
    write_csv(out_dir / "losses.csv", losses)
    write_csv(out_dir / "timing.csv", timing)
    plot(losses, out_dir / PNG)
    (out_dir / "README.md").write_text("\n".join(markdown(losses, timing, wall)) + "\n")
    print(f"wrote {out_dir}/README.md, losses.csv, timing.csv, {PNG} ({wall:.0f} s)")
    return 0

"""Emulation tax: wall time of a 1-rank emulated training iteration against plain numpy.

Run: python benchmarks/emulation_tax.py [--rounds 3] [--iterations 3] [--numeric-dtype fp32]
(fp32, fp64, or bf16: every GEMM rounded as tensor cores do, in both)
One process times, side by side and alternating, (a) iterations of the `train` kind on one
rank (real math plus emulated charges, trace rows, per-iteration HDF5 flush and the trace
read-back for the breakdown) and (b) the one-process reference (`mpiemu.training.reference`, plain
numpy doing the same forward, backward and Adam step, with the same casts), and prints the
ratio of the medians (target <= 1.10; bf16 <= 1.25). A benchmark, not a test: numbers
depend on the machine.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")     # one BLAS thread, as each rank runs under mpiexec

import numpy as np                        # noqa: E402
from mpi4py import MPI                    # noqa: E402

from mpiemu.precision.matmul import PrecisionGemm  # noqa: E402
from mpiemu.training.reference import Reference     # noqa: E402
from mpiemu.runner import train                  # noqa: E402
from mpiemu.config.workload import load_workload   # noqa: E402
from mpiemu.runner.context import close_run, open_run   # noqa: E402

MODEL = ["model.preset='tiny'", "model.hidden=512", "model.heads=8", "model.ffn_hidden=2048",
         "model.layers=4", "model.seq_len=256", "model.vocab=4096", "train.global_batch=4"]


def emulated_iterations(sets: list[str], out: Path) -> list[float]:
    """Wall seconds of each iteration of a 1-rank `train` run (as the runner measures it)."""
    w = load_workload(None, sets)
    train.validate(w, 1)
    ctx = open_run(w, MPI.COMM_WORLD, out, ["emulation_tax"])
    summary = train.run(ctx)
    close_run(ctx, summary)
    return [row["wall_s"] for row in summary["iterations"]]


def reference_iterations(sets: list[str], iterations: int) -> list[float]:
    """Wall seconds of each iteration of the plain numpy reference, same model and data."""
    w = load_workload(None, sets)
    cfg, gb, _ = train.resolve(w)
    ref = Reference(cfg, w.run.seed, w.optimizer.to_config(), gb,
                    np.float64 if w.run.numeric_dtype == "fp64" else np.float32,
                    precision=PrecisionGemm(w.run.numeric_dtype))
    walls = []
    for it in range(iterations):
        t0 = time.perf_counter()
        ref.train_step(it)
        walls.append(time.perf_counter() - t0)
    return walls


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--numeric-dtype", default="fp32", choices=["fp32", "fp64", "bf16"])
    args = ap.parse_args()
    sets = ["run.kind='train'", f"run.iterations={args.iterations}",
            f"run.numeric_dtype='{args.numeric_dtype}'", "run.emulated_dtype='fp16'",
            "device.preset='h100-sxm5'", *MODEL]
    emu: list[float] = []
    ref: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            emu += emulated_iterations(sets, Path(tmp) / f"r{r}")[1:]   # first: warm-up
            ref += reference_iterations(sets, args.iterations)[1:]
    e, p = statistics.median(emu), statistics.median(ref)
    sys.stdout.write(f"model: {' '.join(MODEL)}, {args.numeric_dtype} numerics, 1 rank\n"
                     f"emulated iteration  median {e:.3f} s  (min {min(emu):.3f}, "
                     f"{len(emu)} iterations)\n"
                     f"plain numpy         median {p:.3f} s  (min {min(ref):.3f}, "
                     f"{len(ref)} iterations)\n"
                     f"emulation tax (emulated / plain): {e / p:.3f} of medians, "
                     f"{min(emu) / min(ref):.3f} of minima   target <= "
                     f"{1.25 if args.numeric_dtype == 'bf16' else 1.10}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

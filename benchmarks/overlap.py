"""Wall time of the fused GEMM + collective emulation against the sequential one, same data.

Run: mpiexec -n 4 python -m mpi4py benchmarks/overlap.py [--tokens 4096] [--hidden 1024]
Prints, per operation and strategy, the best wall time over the repetitions (max over ranks)
and the ratio fused / sequential (target <= 1.15): chunked GEMMs, sub-chunk messages and the
timing model must not make the emulation itself much slower. A benchmark, not a test.
"""
from __future__ import annotations

import argparse
import time
from typing import Callable

import numpy as np
from mpi4py import MPI

from _emit import emit  # benchmarks/ is the script's directory

from mpiemu.net import Network, load_network
from mpiemu.comm.p2p import TimedComm
from mpiemu.devices import load_device, device_cost
from mpiemu.overlap.api import GemmShape, gather_then_gemm, gemm_then_reduce
from mpiemu.overlap.strategy import Overlap
from mpiemu.sim.timeline import Timeline

FUSED = ("t3-mca", "t3", "sw-overlap")


def best_times(comm: MPI.Comm, fns: dict[str, Callable[[], object]], reps: int
               ) -> dict[str, float]:
    """Best wall time of each callable (max over ranks per rep), after one warm-up each.

    The callables alternate within every repetition, so a busy machine slows all of them
    alike instead of whichever happened to run during a burst.
    """
    for fn in fns.values():
        fn()
    best = {k: float("inf") for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            comm.Barrier()
            t0 = time.perf_counter()
            fn()
            best[k] = min(best[k], comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    return best


def cases(comm: MPI.Comm, m: int, h: int, bidirectional: bool
          ) -> dict[str, Callable[[str], object]]:
    """One callable per operation, taking the strategy; FC-2-like shapes, float32 data."""
    spec = load_device("t3-gpu")
    rng = np.random.default_rng(comm.rank)
    k = 4 * h // comm.size
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((k, h)).astype(np.float32)
    rows = m // comm.size
    xs = rng.standard_normal((rows, h)).astype(np.float32)
    wc = rng.standard_normal((h, k)).astype(np.float32)

    cost = device_cost(spec)

    def tc() -> TimedComm:
        return TimedComm(comm, Timeline(), Network(load_network(spec.network), comm.size),
                         "bench")

    def ov(s: str) -> Overlap:
        return Overlap(s, bidirectional)

    return {
        "GEMM -> reduce-scatter": lambda s: gemm_then_reduce(
            tc(), x, w, cost=cost, shape=GemmShape(m, h, k), mode="reduce_scatter", dtype="fp16",
            after=0.0, overlap=ov(s)),
        "GEMM -> all-reduce": lambda s: gemm_then_reduce(
            tc(), x, w, cost=cost, shape=GemmShape(m, h, k), mode="all_reduce", dtype="fp16",
            after=0.0,
            overlap=ov(s)),
        "all-gather -> GEMM": lambda s: gather_then_gemm(
            tc(), xs, wc, cost=cost, shape=GemmShape(rows * comm.size, k, h), dtype="fp16",
            after=0.0,
            overlap=ov(s)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--unidirectional", action="store_true")
    ap.add_argument("--out", help="also write the table (Markdown) to this file")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    lines = [f"fused vs sequential emulation, {comm.size} ranks, tokens={args.tokens}, "
             f"hidden={args.hidden}, float32, wall time (best of {args.reps})", "",
             "| operation | sequential (ms) | " + " | ".join(f"{s} (ms) | ratio" for s in FUSED)
             + " |", "|---|---:|" + "---:|---:|" * len(FUSED)]
    for op, fn in cases(comm, args.tokens, args.hidden, not args.unidirectional).items():
        best = best_times(comm, {s: (lambda s=s: fn(s)) for s in ("sequential",) + FUSED},
                          args.reps)
        seq = best["sequential"]
        cells = [f"{best[s] * 1e3:.2f} | {best[s] / seq:.2f}" for s in FUSED]
        lines.append(f"| {op} | {seq * 1e3:.2f} | " + " | ".join(cells) + " |")
    emit(comm, lines, args.out)


if __name__ == "__main__":
    main()

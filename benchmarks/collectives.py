"""Wall-clock bandwidth of our ring RS / AG / AR against MPI's native collectives, side by side.

Run: mpiexec -n 4 python -m mpi4py benchmarks/collectives.py [--max-size 64MiB] [--out FILE]
Prints, per op and size, the wall time of both and the ratio native_time / our_time (= our
bandwidth / native bandwidth; >= 0.9 at 64 MiB is the target). OSU style: warm-up, Barrier,
best of the repetitions. A benchmark, not a test: numbers depend on the machine.
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
from mpiemu.comm.ring import Reduction
from mpiemu.comm.collectives import all_gather, all_reduce, chunk_bounds, reduce_scatter
from mpiemu.devices import load_device, device_cost
from mpiemu.config.schema import parse_size
from mpiemu.sim.timeline import Timeline


def best_time(comm: MPI.Comm, fn: Callable[[], object], reps: int) -> float:
    """Best wall time over reps (max over ranks of each rep), after one warm-up."""
    fn()
    best = float("inf")
    for _ in range(reps):
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        best = min(best, comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    return best


def cases(comm: MPI.Comm, tc: TimedComm, red: Reduction, n: int
          ) -> dict[str, tuple[Callable[[], object], Callable[[], object]]]:
    """(ours, native) callables per op for n float32 elements."""
    x = np.random.default_rng(comm.rank).standard_normal(n).astype(np.float32)
    counts = [hi - lo for lo, hi in chunk_bounds(n, comm.size)]
    lo, hi = chunk_bounds(n, comm.size)[comm.rank]
    rs_out, ag_out, ar_out = np.empty(counts[comm.rank], np.float32), np.empty_like(x), \
        np.empty_like(x)
    mine = x[lo:hi].copy()
    return {
        "reduce_scatter": (lambda: reduce_scatter(tc, x, reduce_s=red, out=rs_out),
                           lambda: comm.Reduce_scatter(x, rs_out, recvcounts=counts)),
        "all_gather": (lambda: all_gather(tc, mine, total=n, out=ag_out),
                       lambda: comm.Allgatherv(mine, [ag_out, counts])),
        "all_reduce": (lambda: all_reduce(tc, x, reduce_s=red, out=ar_out),
                       lambda: comm.Allreduce(x, ar_out)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--min-size", default="1KiB")
    ap.add_argument("--max-size", default="64MiB")
    ap.add_argument("--out", help="also write the table (Markdown) to this file")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    spec = load_device("t3-gpu")
    tc = TimedComm(comm, Timeline(), Network(load_network(spec.network), comm.size), "bench")
    red = device_cost(spec).reduction_s
    lines = [f"ring collectives vs {MPI.Get_library_version().split(chr(10))[0].strip()}, "
             f"{comm.size} ranks, float32, wall time (best of reps)", "",
             "| op | bytes | ours (ms) | native (ms) | bandwidth ratio ours/native |",
             "|---|---:|---:|---:|---:|"]
    size = parse_size("--min-size", args.min_size)
    while size <= parse_size("--max-size", args.max_size):
        n = size // 4
        reps = 20 if size <= 1 << 20 else 8
        for op, (ours, native) in cases(comm, tc, red, n).items():
            t_ours = best_time(comm, ours, reps)
            t_native = best_time(comm, native, reps)
            lines.append(f"| {op} | {size} | {t_ours * 1e3:.3f} | {t_native * 1e3:.3f} | "
                         f"{t_native / t_ours:.2f} |")
        size *= 4
    emit(comm, lines, args.out)


if __name__ == "__main__":
    main()

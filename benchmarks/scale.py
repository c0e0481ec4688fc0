"""Scale: wall time and peak memory of timing-only GPT-3 175B runs as the rank count grows.

Each emulated GPU is one MPI process today (symmetric folding, issue 12, is not built yet),
so wall time grows with the ranks. Runs `workloads/gpt3-175b-tp8.toml` (TP 8, one iteration)
at 8, 16, 32 and 64 ranks (DP 1, 2, 4, 8: two sequences per replica) and
`workloads/gpt3-175b-tp8-pp8.toml` (TP 8 x PP 8, 64 ranks) with 8 micro-batches; prints wall
seconds of the whole command, of the iteration alone (rank 0's), and the largest peak RSS of
any rank (the launcher's children).
Usage: python benchmarks/scale.py [--ranks 8 16 32 64] [--no-pipeline]
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one(ranks: int, workload: str, sets: list[str], out: Path) -> tuple[float, float, float]:
    """(command wall s, iteration wall s, peak RSS MB of the largest rank) of one run."""
    bindir = Path(sys.executable).parent
    cmd = [str(bindir / "mpiexec"), "-n", str(ranks), str(bindir / "mpiemu"), "run", workload,
           "--out", str(out)]
    for s in sets:
        cmd += ["--set", s]
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    wall = time.perf_counter() - t0
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    rows = json.loads((out / "manifest.json").read_text())["summary"]["iterations"]
    return wall, float(rows[0]["wall_s"]), peak_mb


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 16, 32, 64])
    ap.add_argument("--no-pipeline", action="store_true", help="skip the TP 8 x PP 8 run")
    args = ap.parse_args()
    runs = [(n, "workloads/gpt3-175b-tp8.toml",
             [f"parallel.dp={n // 8}", f"train.global_batch={2 * (n // 8)}"]) for n in args.ranks]
    if not args.no_pipeline:
        runs.append((64, "workloads/gpt3-175b-tp8-pp8.toml", ["train.global_batch=8"]))
    print(f"{'ranks':>6} {'workload':<36} {'command s':>10} {'iteration s':>12} "
          f"{'peak MB/rank':>13}")
    with tempfile.TemporaryDirectory() as tmp:
        for k, (n, wl, sets) in enumerate(runs):
            wall, it, peak = one(n, wl, sets, Path(tmp) / f"r{k}")
            print(f"{n:>6} {Path(wl).stem + (' (8 micro-batches)' if 'pp8' in wl else ''):<36} "
                  f"{wall:>10.1f} {it:>12.1f} {peak:>13.0f}", flush=True)
    print("peak MB/rank: the largest resident set of any rank so far (RUSAGE_CHILDREN)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

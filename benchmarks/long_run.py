"""A 3,000-iteration run: wall time per iteration stays flat, `mpiemu analyze` takes seconds.

Runs the quickstart (timing only) for 3,000 iterations on 4 ranks, reads the per-iteration
wall times from its summary (first and last hundred), then times `mpiemu analyze` on it.
Usage: python benchmarks/long_run.py [--iterations N]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--iterations", type=int, default=3000)
    args = ap.parse_args()
    bindir = Path(sys.executable).parent
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "long"
        t0 = time.perf_counter()
        subprocess.run([str(bindir / "mpiexec"), "-n", "4", str(bindir / "mpiemu"), "run",
                        "workloads/quickstart.toml", "--set", f"run.iterations={args.iterations}",
                        "--set", "run.numerics=off", "--set", "train.check_reference=false",
                        "--out", str(out)], cwd=ROOT, check=True, capture_output=True)
        run_s = time.perf_counter() - t0
        rows = json.loads((out / "manifest.json").read_text())["summary"]["iterations"]
        walls = [r["wall_s"] for r in rows]
        k = min(100, len(walls) // 2)
        first, last = sum(walls[:k]) / k, sum(walls[-k:]) / k
        t0 = time.perf_counter()
        subprocess.run([str(bindir / "mpiemu"), "analyze", str(out)], check=True,
                       capture_output=True)
        analyze_s = time.perf_counter() - t0
    print(f"{args.iterations} iterations on 4 ranks: run {run_s:.1f} s; wall per iteration "
          f"{first * 1e3:.1f} ms (first {k}) vs {last * 1e3:.1f} ms (last {k}); "
          f"mpiemu analyze {analyze_s:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

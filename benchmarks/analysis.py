"""Analysis speed: `mpiemu analyze` on an 8-rank T3 run, and analyze / compare / export on
64 ranks x about 100k events each.

1. Runs Mega-GPT-2 TP 8 with T3-MCA (`workloads/mega-gpt2-tp8-t3.toml`, timing only) on 8
   ranks for one iteration and times the whole `mpiemu analyze` command on it.
2. Runs it again for ITERATIONS iterations (about 33k events per rank each), then assembles a
   64-rank run directory from those 8 real rank traces, each copied 8 times under new rank
   numbers (the manifest says 64 ranks as TP 8 x DP 8): the analysis tools cannot tell it from
   a 64-rank run, and a real one of that size takes an hour to emulate on 2 cores. Times
   `analyze`, `compare` (the run against itself), `export --chrome`, `--hta` and
   `--perfetto`, and compares the protobuf's size with the JSON text's.
Each time is the whole command (Python start-up included), wall clock, one run.
Usage: python benchmarks/analysis.py [--iterations 3]
"""
from __future__ import annotations

import argparse
import gzip
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _run(out: Path, iterations: int) -> None:
    subprocess.run([str(BIN / "mpiexec"), "-n", "8", str(BIN / "mpiemu"), "run",
                    "workloads/mega-gpt2-tp8-t3.toml", "--set", f"run.iterations={iterations}",
                    "--out", str(out)], cwd=ROOT, check=True, capture_output=True)


def _timed(*args: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([str(BIN / "mpiemu"), *args], check=True, capture_output=True)
    return time.perf_counter() - t0


def _events(run: Path) -> int:
    from mpiemu.analysis import load
    return sum(len(rt.events) for rt in load(run).ranks)


def replicate(src: Path, dst: Path, copies: int) -> None:
    """A run directory of `copies` x the source's ranks: rank r's file is the source's rank
    r % n renumbered (its `rank` and `dp_rank` attributes), the manifest enlarged to match."""
    manifest = json.loads((src / "manifest.json").read_text())
    n = manifest["world_size"]
    dst.mkdir(parents=True)
    for r in range(n * copies):
        f = dst / f"rank-{r:05d}.h5"
        shutil.copyfile(src / f"rank-{r % n:05d}.h5", f)
        with h5py.File(f, "r+") as h:
            h.attrs["rank"], h.attrs["dp_rank"] = r, r // n
            h.attrs["world_size"] = n * copies
    manifest.update(world_size=n * copies, emulated_ranks=n * copies,
                    grid={**manifest["grid"], "dp": copies},
                    processes=[manifest["processes"][r % n] for r in range(n * copies)])
    (dst / "manifest.json").write_text(json.dumps(manifest))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--iterations", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        one, many, big = Path(tmp) / "t3-1", Path(tmp) / "t3-n", Path(tmp) / "x64"
        _run(one, 1)
        t_one = _timed("analyze", str(one))
        _run(many, args.iterations)
        replicate(many, big, 8)
        n_big = _events(big)
        rows = [("analyze, 8-rank T3 run, 1 iteration", _events(one), t_one, "< 2 s"),
                ("analyze, 64 ranks", n_big, _timed("analyze", str(big)), "seconds"),
                ("compare, 64 ranks vs itself", 2 * n_big,
                 _timed("compare", str(big), str(big)), "seconds"),
                ("export --chrome, 64 ranks", n_big,
                 _timed("export", str(big), "--chrome", str(Path(tmp) / "t.json.gz")),
                 "seconds"),
                ("export --hta, 64 ranks", n_big,
                 _timed("export", str(big), "--hta", str(Path(tmp) / "hta")), "seconds"),
                ("export --perfetto, 64 ranks", n_big,
                 _timed("export", str(big), "--perfetto", str(Path(tmp) / "t.pftrace")),
                 "seconds")]
        sizes = _sizes(Path(tmp) / "t.json.gz", Path(tmp) / "t.pftrace")
    print("| command | events | wall s | target |\n|---|---:|---:|---|")
    for name, n, t, target in rows:
        print(f"| {name} | {n:,} | {t:.2f} | {target} |")
    print(f"\nsizes, 64 ranks: JSON {sizes[0] / 1e6:,.1f} MB (gzip {sizes[1] / 1e6:,.1f} MB), "
          f"Perfetto protobuf {sizes[2] / 1e6:,.1f} MB = {sizes[2] / sizes[0]:.1%} of the JSON "
          f"(target < 10%)")
    return 0


def _sizes(json_gz: Path, pftrace: Path) -> tuple[int, int, int]:
    """(JSON text bytes, its gzip's bytes, the protobuf's bytes)."""
    text = 0
    with gzip.open(json_gz, "rb") as f:
        while chunk := f.read(1 << 24):
            text += len(chunk)
    return text, json_gz.stat().st_size, pftrace.stat().st_size


if __name__ == "__main__":
    sys.exit(main())

"""Golden timelines: the emulated event timeline of six small runs, stored and compared.

A change to emulated time anywhere (a model constant, the network, the ring, the trainer)
shows as a readable diff against `tests/golden/<case>.csv.gz`. When the change is meant:

    make goldens        # = .venv/bin/python -m tests.golden_timelines

and commit the files with the reason. Rows: rank, name, category, resource, start, end
(floats in `repr`: shortest exact round trip, so equal text is bit-identical time).
"""
from __future__ import annotations

import gzip
import sys
import tempfile
from pathlib import Path

from mpiemu.analysis import load
from tests.conftest import ROOT, run_mpi

GOLDEN = ROOT / "tests" / "golden"
CASES: dict[str, tuple[int, str, list[str]]] = {
    "quickstart": (4, "workloads/quickstart.toml",
                   ["run.iterations=1", "train.check_reference=false", "run.numerics=off"]),
    "collectives": (4, "workloads/collectives.toml",
                    ["collectives.sizes=['4KiB', '1MiB']", "run.numerics=off"]),
    "t3_sublayer": (4, "workloads/t3_sublayers.toml",
                    ["parallel.tp=4", "sublayers.sublayers=['FC-2-fwd']",
                     "sublayers.strategies=['sequential', 't3-mca']",
                     "sublayers.models=[{name='mega-gpt2', hidden=3072, tokens=2048}]"]),
    "sunway_layer": (2, "workloads/gpt3-6.7b-sunway-tp8.toml",
                     ["parallel.tp=2", "model.layers=1", "model.seq_len=512",
                      "train.global_batch=1"]),
    # interleaved 1F1B, TP 2 x PP 2, 2 model chunks per stage, 4 micro-batches, SP, ZeRO-1
    "pipeline": (4, "workloads/pipeline-small.toml",
                 ["parallel.dp=1", "parallel.schedule='interleaved'", "parallel.virtual_stages=2",
                  "train.global_batch=4", "run.iterations=1", "run.numerics=off",
                  "train.check_reference=false"]),
    # TP 2 x PP 2 x DP 2 on 2 processes (run.fold: one per stage), expanded to 8 ranks
    "folded": (2, "workloads/pipeline-small.toml",
               ["run.iterations=1", "run.numerics=off", "train.check_reference=false",
                "run.fold='on'"]),
}


def run_case(name: str, out: Path, extra: list[str] | None = None) -> Path:
    """Run one case into `out`; raises with the run's stderr when it fails."""
    ranks, workload, sets = CASES[name]
    args = ["run", workload, "--out", str(out)]
    for s in [*sets, *(extra or [])]:
        args += ["--set", s]
    res = run_mpi(ranks, args, timeout=300)
    if res.returncode != 0:
        raise RuntimeError(f"golden case {name} failed: {res.stderr[-2000:]}")
    return out


def timeline(run_dir: Path) -> list[str]:
    """The run's events, rank by rank in recorded order, as CSV lines."""
    lines = ["rank,name,cat,resource,t_start,t_end"]
    for rt in load(run_dir).ranks:
        ev = rt.events
        lines += [f"{rt.rank},{rt.names[i]},{rt.cats[i]},{rt.resources[i]},"
                  f"{float(ev['t_start'][i])!r},{float(ev['t_end'][i])!r}"
                  for i in range(len(ev))]
    return lines


def golden_path(name: str) -> Path:
    return GOLDEN / f"{name}.csv.gz"


def read_golden(name: str) -> list[str]:
    with gzip.open(golden_path(name), "rt") as f:
        return f.read().splitlines()


def write_golden(name: str, lines: list[str]) -> Path:
    GOLDEN.mkdir(exist_ok=True)
    with gzip.GzipFile(golden_path(name), "wb", mtime=0) as f:   # same bytes every time
        f.write(("\n".join(lines) + "\n").encode())
    return golden_path(name)


def main(names: list[str]) -> int:
    for name in names or list(CASES):
        with tempfile.TemporaryDirectory() as tmp:
            lines = timeline(run_case(name, Path(tmp) / name))
        sys.stdout.write(f"wrote {write_golden(name, lines)} ({len(lines) - 1} events)\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

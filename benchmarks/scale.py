"""Scale: wall time and peak memory of timing-only runs, unfolded and folded (`run.fold`).

Unfolded, each emulated GPU is one MPI process, so wall time grows with the ranks:
`workloads/gpt3-175b-tp8.toml` (TP 8, one iteration) at 8, 16, 32 and 64 ranks (DP 1, 2, 4,
8: two sequences per replica) and `workloads/gpt3-175b-tp8-pp8.toml` (TP 8 x PP 8, 64
ranks) with 8 micro-batches. Folded, one MPI process per pipeline stage stands for its
TP x DP GPUs: GPT-3 175B at TP 8 x PP 8 x DP 16 / 32 / 64 (1024 / 2048 / 4096 GPUs, global
batch 1536 as Narayanan et al. 2021 Table 2) and the 1T model at TP 8 x PP 64 x DP 6 (3072
GPUs, global batch 3072, Table 1), with the distributed optimizer (its DP reduce-scatter and
all-gather are rings: folding is exact; NCCL's tree for a DP all-reduce across nodes is not).
Prints wall seconds of the whole command, the CPU seconds of all its processes, wall seconds
of the iteration alone (rank 0's), the largest peak RSS of any rank (the launcher's children)
and the emulated iteration; first, the floor: as many processes as the smallest run only
starting (Python, numpy, MPI_Init, h5py, mpiemu), wall and CPU seconds; and the smallest
run's command with a one-layer model (what it costs besides its layers).
`--exact` first checks folded == unfolded bit for bit on three workloads at 8, 16 and 32 ranks;
`--against GITREF` times one command with this tree and with GITREF (a git worktree)
alternately, `--repeat` times each, and prints both medians and their ratio: the first run
`--only` selects, else the smallest unfolded run.
Folded too: Llama 3.1 405B at TP 8 x PP 16 x DP 128 (16,384 GPUs, its pre-training layout,
`workloads/llama3.1-405b-tp8-pp16-dp128.toml`).
Usage: python benchmarks/scale.py [--ranks 8 16 32 64] [--no-pipeline] [--no-folded] [--exact]
       [--against GITREF [--repeat N]] [--only TEXT]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent          # the venv's mpiexec and mpiemu


def _cpu_s() -> float:
    """CPU seconds (user + system) of every finished child process so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _timed(cmd: list[str], **kw: Any) -> tuple[float, float]:
    """(wall s, CPU s of all its processes) of `cmd` run to the end (`kw`: subprocess.run's)."""
    t0, cpu0 = time.perf_counter(), _cpu_s()
    subprocess.run(cmd, check=True, capture_output=True, **kw)
    return time.perf_counter() - t0, _cpu_s() - cpu0


def one(ranks: int, workload: str, sets: list[str], out: Path, code: Path | None = None
        ) -> tuple[float, float, float, float, float]:
    """(command wall s, iteration wall s, peak RSS MB of the largest rank, emulated
    iteration s, CPU s of all its processes) of one run; `code`: run the mpiemu found there
    (`python -m mpiemu`, outside this tree) instead of this tree's."""
    prog = [str(BIN / "mpiemu")] if code is None else [sys.executable, "-m", "mpiemu"]
    cmd = [str(BIN / "mpiexec"), "-n", str(ranks), *prog, "run", str(ROOT / workload),
           "--out", str(out)]
    for s in sets:
        cmd += ["--set", s]
    env = None if code is None else {**os.environ, "PYTHONPATH": str(code)}
    wall, cpu = _timed(cmd, cwd=ROOT if code is None else out.parent, env=env)
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    rows = json.loads((out / "manifest.json").read_text())["summary"]["iterations"]
    return (wall, float(rows[0]["wall_s"]), peak_mb,
            float(rows[0]["t_end"] - rows[0]["t_start"]), cpu)


def floor(ranks: int) -> list[tuple[float, float]]:
    """(wall s, CPU s) of `ranks` processes that only start: importing numpy, mpi4py
    (MPI_Init) and h5py; and importing mpiemu's run modules too. What no unfolded run on this
    host beats."""
    return [_timed([str(BIN / "mpiexec"), "-n", str(ranks), sys.executable, "-c",
                    f"import {mods}"], cwd=ROOT)
            for mods in ("numpy, mpi4py.MPI, h5py", "mpiemu.runner.job, mpiemu.runner.train")]


TP8 = "workloads/gpt3-175b-tp8.toml"
PP8 = "workloads/gpt3-175b-tp8-pp8.toml"


def tp8_sets(ranks: int) -> list[str]:
    """GPT-3 175B TP 8 on `ranks` ranks: DP = ranks / 8, two sequences per replica."""
    return [f"parallel.dp={ranks // 8}", f"train.global_batch={2 * (ranks // 8)}"]

ZERO = ["optimizer.zero=1"]
H100_TP4 = ["parallel.tp=4", "parallel.dp=32", "train.global_batch=1536",
            "device.preset=h100-sxm5", "network.preset=dgx-h100"]
FOLDED = [(8, 1024, PP8, ["parallel.dp=16", "train.global_batch=1536", *ZERO]),
          (8, 2048, PP8, ["parallel.dp=32", "train.global_batch=1536", *ZERO]),
          (8, 4096, PP8, ["parallel.dp=64", "train.global_batch=1536", *ZERO]),
          # TP 4 inside DGX H100 nodes, DP 32 across them: two classes of images per stage
          # (a DP shift by one GPU moves no whole node), plain DP all-reduce (local DDP:
          # one ring by NCCL's tuner) and with the distributed optimizer
          (16, 1024, PP8, [*H100_TP4, "train.memory_check=warn"]),
          (16, 1024, PP8, [*H100_TP4, *ZERO]),
          (64, 3072, "workloads/megatron-1t-tp8-pp64.toml",
           ["parallel.dp=6", "train.global_batch=3072", *ZERO]),
          # Llama 3.1 405B as pre-trained (Llama 3 paper Table 4): TP 8 x PP 16 x DP 128
          (16, 16384, "workloads/llama3.1-405b-tp8-pp16-dp128.toml", []),
          # Mixtral 8x7B, experts split over EP 8 = TP 8 (SP), DP 32, PP 4: 1,024 H100s
          (4, 1024, "workloads/mixtral-8x7b-ep8.toml",
           ["parallel.tp=8", "parallel.ep=8", "parallel.dp=32", "parallel.pp=4",
            "parallel.sequence_parallel=true", "train.global_batch=1024", *ZERO])]
SMALL = ["model.layers=8", "train.memory_check=warn", "run.iterations=1"]
# (what, unfolded ranks, folded ranks, workload, overrides): four symmetry kinds
EXACT = [("TP ring", 8, 1, TP8, ["model.layers=2", *SMALL[1:]]),
         ("TP x DP, 4 nodes", 16, 1, PP8,
          ["parallel.tp=4", "parallel.dp=4", "parallel.pp=1", "network.devices_per_node=4",
           "parallel.schedule=1f1b", "parallel.virtual_stages=1", "train.global_batch=8",
           *ZERO, *SMALL]),
         ("TP 4 x DP 4 in 8-GPU nodes, two classes", 16, 2, PP8,
          ["parallel.tp=4", "parallel.dp=4", "parallel.pp=1", "parallel.schedule=1f1b",
           "parallel.virtual_stages=1", "train.global_batch=8", *ZERO, *SMALL]),
         ("TP x PP x DP, interleaved", 32, 4, PP8,
          ["parallel.tp=4", "parallel.dp=2", "parallel.pp=4", "parallel.virtual_stages=2",
           "train.global_batch=16", *ZERO, *SMALL])]


def exact(tmp: Path) -> bool:
    """Folded and unfolded runs of the EXACT workloads: bit-identical per emulated rank?"""
    from mpiemu.analysis import load  # noqa: PLC0415
    from mpiemu.analysis.unfold import timeline_differences  # noqa: PLC0415
    ok = True
    for k, (what, full, folded, wl, sets) in enumerate(EXACT):
        a, b = tmp / f"x{k}u", tmp / f"x{k}f"
        one(full, wl, sets, a)
        one(folded, wl, sets, b)
        diff = timeline_differences(load(a).ranks, load(b).ranks)
        ok &= not diff
        print(f"exact: {what}: {full} ranks vs {folded} folded: "
              f"{'bit-identical' if not diff else diff[0]}", flush=True)
    return ok


def _compile(code: Path) -> None:
    """Bytecode first, as pip does at install: the runs time the emulator, not Python's
    compiler (with PYTHONDONTWRITEBYTECODE set, every process would compile every module)."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(code / "mpiemu")], check=True,
                   capture_output=True)


def against(ref: str, run: tuple[int, int, str, list[str]], repeat: int, tmp: Path) -> None:
    """One run's command with this tree and with git `ref` (a worktree), alternating: the
    host's speed drifts by 10-20% within minutes, so only runs side by side compare."""
    base = tmp / "against"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(base), ref],
                   check=True)
    n, gpus, wl, sets = run
    try:
        _compile(base)
        walls: dict[str, list[float]] = {ref: [], "this tree": []}
        for _ in range(repeat):
            for name, code in ((ref, base), ("this tree", ROOT)):
                walls[name].append(one(n, wl, sets, tmp / "a", code)[0])
        med = {k: statistics.median(v) for k, v in walls.items()}
        print(f"against {ref}: {Path(wl).stem} on {gpus} GPUs, {n} processes, {repeat} "
              "alternating runs each: " +
              "; ".join(f"{k} median {med[k]:.2f} s ({min(v):.2f}-{max(v):.2f})"
                        for k, v in walls.items()) +
              f"; this tree / {ref}: {med['this tree'] / med[ref]:.3f}", flush=True)
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)],
                       check=False, capture_output=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 16, 32, 64])
    ap.add_argument("--no-pipeline", action="store_true", help="skip the TP 8 x PP 8 run")
    ap.add_argument("--no-folded", action="store_true", help="skip the folded runs")
    ap.add_argument("--exact", action="store_true", help="check folded == unfolded first")
    ap.add_argument("--against", metavar="GITREF",
                    help="also time the smallest run's command with GITREF, alternating")
    ap.add_argument("--repeat", type=int, default=5, help="alternations with --against")
    ap.add_argument("--only", metavar="TEXT",
                    help="only the runs whose workload file name contains TEXT")
    args = ap.parse_args()
    runs = [(n, n, TP8, tp8_sets(n)) for n in args.ranks]
    if not args.no_pipeline:
        runs.append((64, 64, PP8, ["train.global_batch=8"]))
    if not args.no_folded:
        runs += FOLDED
    if args.only:
        runs = [r for r in runs if args.only in Path(r[2]).name]
        args.ranks = []
    _compile(ROOT)
    with tempfile.TemporaryDirectory() as tmp:
        if args.exact and not exact(Path(tmp)):
            return 1
        if args.against:        # the first selected run (--only), else the smallest
            n = args.ranks[0] if args.ranks else 8
            against(args.against, runs[0] if args.only else (n, n, TP8, tp8_sets(n)),
                    args.repeat, Path(tmp))
            return 0
        if args.ranks:
            (bare, bare_cpu), (mods, mods_cpu) = floor(args.ranks[0])
            print(f"floor: {args.ranks[0]} processes importing numpy, mpi4py, h5py: "
                  f"{bare:.1f} s ({bare_cpu:.1f} CPU s); and mpiemu's run modules: {mods:.1f} s "
                  f"({mods_cpu:.1f} CPU s)", flush=True)
            n = args.ranks[0]
            wall, _, _, _, cpu = one(n, TP8, [*tp8_sets(n), "model.layers=1"], Path(tmp) / "fixed")
            print(f"fixed: the {n}-rank command with a one-layer model: {wall:.2f} s "
                  f"({cpu:.1f} CPU s); the rest of each row below is its layers", flush=True)
        print(f"{'ranks':>6} {'GPUs':>5} {'workload':<52} {'command s':>10} {'CPU s':>7} "
              f"{'iteration s':>12} {'peak MB/rank':>13} {'emulated s':>11}")
        for k, (n, gpus, wl, sets) in enumerate(runs):
            wall, it, peak, emu, cpu = one(n, wl, sets, Path(tmp) / f"r{k}")
            m = next((int(s.split("=")[1]) for s in sets if "global_batch" in s), 0)
            dp = next((int(s.split("=")[1]) for s in sets if "parallel.dp" in s), 1)
            what = Path(wl).stem + (f" ({m // dp} micro-batches)" if m and "pp" in wl else "")
            what += " TP 4, H100" + (", ZeRO-1" if ZERO[0] in sets else ", plain DP") \
                if "parallel.tp=4" in sets else ""
            print(f"{n:>6} {gpus:>5} {what:<52} {wall:>10.2f} {cpu:>7.1f} {it:>12.1f} "
                  f"{peak:>13.0f} {emu:>11.3f}", flush=True)
    print("CPU s: user + system time of every process of the command (on this host's cores, "
          "command s >= CPU s / cores); peak MB/rank: the largest resident set of any rank so "
          "far (RUSAGE_CHILDREN)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

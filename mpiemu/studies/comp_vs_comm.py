"""`mpiemu report comp_vs_comm`: thesis (seed 003) chapter 5, computation vs communication as
Transformers and hardware scale, from emulated runs (not formulas).

Every point is one transformer layer (forward + backward) of the `layer_sweep` kind on real
MPI ranks, timing only (`workloads/comp_vs_comm.toml`, MI210 preset, the network of
`comp_vs_comm.toml`): one job per TP degree of `--tp` (4 to 256, Table 5.1) for the
serialized TP shares (Figs. 5.9, 5.12), one TP x DP job for the FC weight's DP all-reduce
against the backward GEMMs that hide it (Figs. 5.10, 5.11; the thesis's region of interest),
each over H x SL x B x compute scale, and Fig. 5.13's case point at its TP with its DP step. Each
job folds onto one process (`run.fold`: its TP x DP ranks are symmetric; bit-identical times,
tests/test_fold.py). Writes tp.csv, dp.csv, case.csv, tp_share.png, dp_share.png and README.md
(`comp_vs_comm_report.py`). Golden test: the scale 1, H <= 8K rows of tp.csv (TP = 4) and dp.csv.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from . import runs as launch
from .common import ROOT, Golden, Row, load_figures, read_csv, write_csv

WORKLOAD = ROOT / "workloads" / "comp_vs_comm.toml"
INTS = ("point", "hidden", "seq_len", "batch", "tp", "dp")
KEEP = ("hidden", "seq_len", "batch", "tp", "dp", "compute_scale", "time_s", "compute_s",
        "gemm_s", "attn_core_s", "tp_comm_s", "tp_share", "bwd_gemm_s", "dp_comm_s",
        "dp_over_bwd", "dp_layer_s")
GOLDEN_H = 8192


def _fig() -> dict[str, Any]:
    return {k: v.value for k, v in load_figures("comp_vs_comm").items()}


def valid_hidden(hidden: list[int], tp: int, head_dim: int) -> list[int]:
    """The H whose heads (H / head_dim) split over tp ranks."""
    return [h for h in hidden if h % head_dim == 0 and (h // head_dim) % tp == 0]


def _list(xs: list[Any]) -> str:
    return "[" + ", ".join(str(x) for x in xs) + "]"


def sweep(tp: int, dp: int, runs: Path, hidden: list[int] | None = None,
          scales: list[float] | None = None, extra: list[str] = ()) -> list[Row]:  # type: ignore[assignment]
    """One `layer_sweep` job on tp x dp ranks; its rows (H that do not split are left out)."""
    f = _fig()
    hs = valid_hidden(hidden or f["hidden"], tp, f["head_dim"])
    if not hs:
        return []
    out = runs / f"tp{tp}-dp{dp}"
    sets = [f"parallel.tp={tp}", f"parallel.dp={dp}", f"device.preset='{f['device']}'",
            f"layer_sweep.hidden={_list(hs)}", f"layer_sweep.seq_len={_list(f['seq_len'])}",
            f"layer_sweep.batch={_list(f['batch'])}", f"layer_sweep.head_dim={f['head_dim']}",
            f"layer_sweep.compute_scale={_list(scales or f['compute_scales'])}",
            *f["network"], *extra]
    n = launch.processes(WORKLOAD, sets, tp * dp)     # folded (one process) where exact
    print(f"running: mpiexec -n {n} mpiemu run {WORKLOAD.name} (tp={tp}, dp={dp}, "
          f"{len(hs)} H)", flush=True)
    launch.run(n, WORKLOAD, sets, out, timeout=3000)
    rows = []
    for r in read_csv(out / "layer_sweep.csv"):
        row: Row = {k: int(r[k]) if k in INTS else float(r[k]) for k in KEEP}
        row["highlighted"] = row["hidden"] // row["tp"] == f["highlighted_h_per_tp"]
        rows.append(row)
    return rows


def golden() -> list[Golden]:
    """The compute-scale 1 rows with H <= 8K of the TP = 4 job and of the TP x DP job: two
    folded jobs of a few seconds each."""
    f = _fig()
    hs, g = [h for h in f["hidden"] if h <= GOLDEN_H], f["dp_grid"]
    with tempfile.TemporaryDirectory(prefix="mpiemu-cvc-") as tmp:
        tp_rows = sweep(4, 1, Path(tmp), hs, [1.0])
        dp_rows = sweep(g["tp"], g["dp"], Path(tmp), hs, [1.0])

    def small(r: dict[str, str]) -> bool:
        return float(r["compute_scale"]) == 1 and int(r["hidden"]) <= GOLDEN_H

    return [Golden("tp.csv", tp_rows, lambda r: r["tp"] == "4" and small(r)),
            Golden("dp.csv", dp_rows, small)]


def main(out_dir: Path, argv: list[str]) -> int:
    f = _fig()
    ap = argparse.ArgumentParser(prog="mpiemu report comp_vs_comm", description=__doc__)
    ap.add_argument("--tp", type=int, nargs="+", default=list(f["tp_run"]),
                    help=f"TP degrees to run (Table 5.1: {f['tp_all']})")
    ap.add_argument("--no-dp", action="store_true", help="skip the TP x DP job")
    ap.add_argument("--set", action="append", default=[], help="extra workload overrides")
    ap.add_argument("--keep-runs", type=Path, help="keep the run directories here")
    ap.add_argument("--out", type=Path, help="output directory (as `mpiemu report --out`)")
    args = ap.parse_args([a for a in argv if a != "--"])
    out_dir = args.out or out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="mpiemu-cvc-") as tmp:
        runs = args.keep_runs or Path(tmp)
        tp_rows = [r for tp in args.tp for r in sweep(tp, 1, runs, extra=args.set)]
        g, cs = f["dp_grid"], f["case_study"]
        dp_rows = [] if args.no_dp else sweep(g["tp"], g["dp"], runs, extra=args.set)
        # Fig. 5.13's point with its DP step, at its own TP (5.3.3.7)
        case_rows = [] if args.no_dp else sweep(
            cs["tp"], g["dp"], runs, [cs["hidden"]], [float(cs["scale"])],
            extra=[*args.set, f"layer_sweep.seq_len=[{cs['seq_len']}]",
                   f"layer_sweep.batch=[{cs['batch']}]"])
    write_csv(out_dir / "tp.csv", tp_rows)
    if dp_rows:
        write_csv(out_dir / "dp.csv", dp_rows)
        write_csv(out_dir / "case.csv", case_rows)
    from .comp_vs_comm_report import markdown, plot_dp, plot_tp  # noqa: PLC0415
    plot_tp(tp_rows, out_dir / "tp_share.png")
    if dp_rows:
        plot_dp(dp_rows, out_dir / "dp_share.png")
    (out_dir / "README.md").write_text(
        "\n".join(markdown(tp_rows, dp_rows, case_rows, args.tp)) + "\n")
    print(f"wrote {out_dir}/README.md and CSV/PNG beside it")
    return 0

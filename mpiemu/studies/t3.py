"""`mpiemu report t3`: the T3 sub-layer study (thesis 8.5) regenerated from our own runs.

Runs `workloads/t3_sublayers.toml` timing-only at tp=8 and tp=16 (`mpiexec -n tp`), then
writes `README.md` (ours beside the thesis, `t3_report.py`), `sublayers.csv` (every run),
`summary.csv` (geomean / max per strategy), `speedup.png` and `dram.png`. The thesis's
numbers are in `t3.toml`. Raw run directories go to a temporary folder and are deleted.
Golden test: the tp=8 runs (half the study, about 6 s) against the committed rows.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from . import runs as launch
from ..workloads import DIR as WORKLOADS_DIR
from .common import Golden, Row, geomean, load_figures

ORDER = ("ideal", "ideal+nmc", "sw-overlap(16)", "sw-overlap(8)", "t3", "t3-mca")
COMPARED = ("ideal", "t3", "t3-mca")         # strategies the thesis gives geomean / max for
SENSITIVE = (*COMPARED, "sw-overlap(16)", "sw-overlap(8)")   # columns of the sensitivity table
DRAM_KEYS = ("gemm_read", "gemm_write", "rs_read", "rs_write", "ag_read", "ag_write")
INT_KEYS = ("tp", "m", "n", "k", "n_stages", "mca_threshold")


# One assumption changed at a time (docs/t3.md, Sensitivity): what the report's geomeans
# give with it; each is a `--set` on the same sweep.
SENSITIVITY = (
    ("round-robin exposure 1 instead of 2", ("device.t3.round_robin_exposure=1",)),
    ("MCA intensity cutoffs halved (15 / 7.5 / 2.5%)",
     ("device.t3.mca_intensity_high=0.15", "device.t3.mca_intensity_mid=0.075",
      "device.t3.mca_intensity_low=0.025")),
    ("MCA intensity cutoffs doubled (60 / 30 / 10%)",
     ("device.t3.mca_intensity_high=0.6", "device.t3.mca_intensity_mid=0.3",
      "device.t3.mca_intensity_low=0.1")),
    ("starvation limit of 4 cycles instead of 8", ("device.t3.mca_starvation_limit_cycles=4",)),
    ("communication CU bandwidth halved (17.5 GB/s)", ("device.t3.comm_cu_bw_GBps=17.5",)),
    ("communication CU bandwidth doubled (70 GB/s)", ("device.t3.comm_cu_bw_GBps=70",)),
    ("unidirectional ring", ("overlap.bidirectional=false",)),
)


def thesis() -> dict[str, tuple[float, float]]:
    """Per compared strategy: the thesis's (geomean, max) speedup over sequential."""
    f = load_figures("t3")
    return {s: (float(f[f"{s}_geomean"]), float(f[f"{s}_max"])) for s in COMPARED}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="mpiemu report t3", description=__doc__)
    p.add_argument("--tp", type=int, nargs="+", default=[8, 16])
    p.add_argument("--workload", default=str(WORKLOADS_DIR / "t3_sublayers.toml"))
    p.add_argument("--set", action="append", default=[], help="extra workload overrides")
    p.add_argument("--keep-runs", help="keep the raw run directories here")
    p.add_argument("--timeout", type=int, default=1200, help="seconds per mpiexec run")
    p.add_argument("--out", help="output directory (when the CLI passes it through)")
    p.add_argument("--no-sensitivity", action="store_true",
                   help="skip the sweeps with one assumption changed (SENSITIVITY)")
    return p.parse_args(argv)


def run_sweep(tp: int, args: argparse.Namespace, runs: Path) -> list[Row]:
    """One timing-only run of the sub-layer workload on tp ranks; its CSV rows."""
    from .common import read_csv  # noqa: PLC0415
    out = runs / f"tp{tp}"
    sys.stdout.write(f"running: mpiexec -n {tp} mpiemu run {args.workload} ... tp={tp}\n")
    sys.stdout.flush()
    launch.run(tp, args.workload, [f"parallel.tp={tp}", "run.numerics='off'", *args.set], out,
               args.timeout)
    return [_typed(r) for r in read_csv(out / "sublayers.csv")]


def _typed(r: dict[str, str]) -> Row:
    out: Row = {}
    for k, v in r.items():
        try:
            out[k] = int(v) if k in INT_KEYS else float(v)
        except ValueError:
            out[k] = v
    return out


def cases(rows: list[Row]) -> dict[tuple[str, int, str], dict[str, Row]]:
    """(model, tp, sub-layer) -> strategy label -> row."""
    out: dict[tuple[str, int, str], dict[str, Row]] = defaultdict(dict)
    for r in rows:
        out[(r["model"], r["tp"], r["sublayer"])][r["strategy"]] = r
    return out


def summarize(rows: list[Row]) -> dict[str, dict[str, float]]:
    """Per strategy: geomean and max speedup over sequential, DRAM change mean and max."""
    cs = cases(rows)
    out = {}
    for s in ORDER:
        sp = [c[s]["speedup"] for c in cs.values() if s in c]
        dr = [c[s]["dram_total"] / c["sequential"]["dram_total"] - 1 for c in cs.values()
              if s in c]
        if sp:
            out[s] = {"geomean": geomean(sp) - 1, "max": max(sp) - 1,
                      "dram_mean": sum(dr) / len(dr), "dram_max": min(dr)}
    return out


def acceptance(summ: dict[str, dict[str, float]]) -> list[str]:
    """The issue's checks: within tolerance of the thesis, and the ordering of the geomeans."""
    tol = float(load_figures("t3")["acceptance_pp"])
    lines = []
    for s, (g, _) in thesis().items():
        d = summ[s]["geomean"] - g
        lines.append(f"- {s}: geomean {100 * summ[s]['geomean']:.1f}% vs thesis {100 * g:.0f}%"
                     f" ({100 * d:+.1f} pp): {'within' if abs(d) <= tol else 'OUTSIDE'} "
                     f"{100 * tol:.0f} pp")
    t3, mca, nmc = (summ[k]["geomean"] for k in ("t3", "t3-mca", "ideal+nmc"))
    ok = 0 < t3 < mca <= nmc + 1e-12
    lines.append(f"- ordering sequential < t3 < t3-mca <= ideal+nmc: 0 < {100 * t3:.1f}% < "
                 f"{100 * mca:.1f}% <= {100 * nmc:.1f}%: {'holds' if ok else 'VIOLATED'}")
    return lines


def summary_rows(summ: dict[str, dict[str, float]]) -> list[Row]:
    th: dict[str, tuple[float | None, float | None]] = dict(thesis())
    return [{"strategy": s, "geomean_speedup": round(v["geomean"], 4),
             "thesis_geomean": th.get(s, (None, None))[0], "max_speedup": round(v["max"], 4),
             "thesis_max": th.get(s, (None, None))[1],
             "dram_change_mean": round(v["dram_mean"], 4),
             "dram_change_max": round(v["dram_max"], 4)} for s, v in summ.items()]


def sweep(args: argparse.Namespace) -> list[Row]:
    runs = Path(args.keep_runs) if args.keep_runs else Path(tempfile.mkdtemp(prefix="t3-"))
    try:
        return [r for tp in args.tp for r in run_sweep(tp, args, runs)]
    finally:
        if not args.keep_runs:
            shutil.rmtree(runs, ignore_errors=True)


def sensitivity(args: argparse.Namespace, shipped: dict[str, dict[str, float]]) -> list[Row]:
    """The geomean speedups of the compared strategies, shipped and with each SENSITIVITY
    change (the same sweep, one `--set` group more)."""
    out = [_sensitivity_row("none (shipped)", (), shipped)]
    for label, sets in SENSITIVITY:
        changed = argparse.Namespace(**{**vars(args), "set": [*args.set, *sets]})
        out.append(_sensitivity_row(label, sets, summarize(sweep(changed))))
    return out


def _sensitivity_row(label: str, sets: tuple[str, ...], summ: dict[str, dict[str, float]]
                     ) -> Row:
    return {"change": label, "overrides": " ".join(sets)} | {
        f"{s}_geomean": round(summ[s]["geomean"], 4) for s in SENSITIVE}


def golden() -> list[Golden]:
    """The tp=8 half of the sweep (8 ranks, timing only) against the committed tp=8 rows."""
    rows = sweep(parse_args(["--tp", "8"]))
    return [Golden("sublayers.csv", rows, lambda r: r["tp"] == "8")]

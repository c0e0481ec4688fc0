"""`mpiemu report t3`: the T3 sub-layer study (thesis 8.5) regenerated from our own runs.

Runs `workloads/t3_sublayers.toml` timing-only at tp=8 and tp=16 (`mpiexec -n tp`), then
writes to the output directory: `README.md` (tables, ours beside the thesis's), `sublayers.csv`
(every run), `summary.csv` (geomean / max per strategy), `speedup.png` and `dram.png`.
Raw run directories go to a temporary folder and are deleted (reports only).
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
# thesis 8.5.1-8.5.2 (seed 003): geomean / max speedup over sequential, DRAM traffic change
THESIS = {"ideal": (0.35, 0.50), "t3": (0.20, 0.39), "t3-mca": (0.30, 0.47)}
THESIS_DRAM = (-0.22, -0.36)          # T3 / T3-MCA data movement vs sequential: mean, max
ORDER = ("ideal", "ideal+nmc", "sw-overlap(16)", "sw-overlap(8)", "t3", "t3-mca")
DRAM_KEYS = ("gemm_read", "gemm_write", "rs_read", "rs_write", "ag_read", "ag_write")


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="mpiemu report t3", description=__doc__)
    p.add_argument("--tp", type=int, nargs="+", default=[8, 16])
    p.add_argument("--workload", default=str(ROOT / "workloads" / "t3_sublayers.toml"))
    p.add_argument("--set", action="append", default=[], help="extra workload overrides")
    p.add_argument("--keep-runs", help="keep the raw run directories here")
    p.add_argument("--timeout", type=int, default=1200, help="seconds per mpiexec run")
    p.add_argument("--out", help="output directory (when the CLI passes it through)")
    return p.parse_args(argv)


def _mpiexec() -> str:
    local = Path(sys.executable).parent / "mpiexec"
    return str(local) if local.exists() else (shutil.which("mpiexec") or "mpiexec")


def _child_env(timeout: int) -> dict[str, str]:
    """This environment minus any launcher's variables (we may run under mpiexec ourselves)."""
    drop = ("PMI_", "PMIX_", "HYDRA_", "MPI_LOCAL", "MPICH_", "OMPI_", "PRTE_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MPIEXEC_TIMEOUT=str(timeout))
    return env


def run_sweep(tp: int, args: argparse.Namespace, runs: Path) -> list[dict[str, Any]]:
    """One timing-only run of the sub-layer workload on tp ranks; its CSV rows."""
    out = runs / f"tp{tp}"
    cmd = [_mpiexec(), "-n", str(tp), sys.executable, "-m", "mpiemu", "run", args.workload,
           "--set", f"parallel.tp={tp}", "--set", "run.numerics='off'", "--out", str(out)]
    for item in args.set:
        cmd += ["--set", item]
    sys.stdout.write(f"running: {' '.join(cmd[:4])} ... tp={tp}\n")
    sys.stdout.flush()
    res = subprocess.run(cmd, capture_output=True, text=True, env=_child_env(args.timeout),
                         timeout=args.timeout + 60, cwd=ROOT)
    if res.returncode != 0:
        raise RuntimeError(f"tp={tp} run failed ({res.returncode}): "
                           f"{(res.stderr or res.stdout).strip()[-2000:]}")
    with (out / "sublayers.csv").open() as f:
        return [_typed(r) for r in csv.DictReader(f)]


def _typed(r: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in r.items():
        try:
            out[k] = int(v) if k in ("tp", "m", "n", "k", "n_stages", "mca_threshold") \
                else float(v)
        except ValueError:
            out[k] = v
    return out


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else math.nan


def _cases(rows: list[dict[str, Any]]) -> dict[tuple[str, int, str], dict[str, dict[str, Any]]]:
    """(model, tp, sub-layer) -> strategy label -> row."""
    out: dict[tuple[str, int, str], dict[str, dict[str, Any]]] = defaultdict(dict)
    for r in rows:
        out[(r["model"], r["tp"], r["sublayer"])][r["strategy"]] = r
    return out


def summarize(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per strategy: geomean and max speedup over sequential, DRAM change mean and max."""
    cases = _cases(rows)
    out = {}
    for s in ORDER:
        sp = [c[s]["speedup"] for c in cases.values() if s in c]
        dr = [c[s]["dram_total"] / c["sequential"]["dram_total"] - 1 for c in cases.values()
              if s in c]
        if sp:
            out[s] = {"geomean": geomean(sp) - 1, "max": max(sp) - 1,
                      "dram_mean": sum(dr) / len(dr), "dram_max": min(dr)}
    return out


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}%" if math.isfinite(x) else "-"


def summary_table(summ: dict[str, dict[str, float]]) -> list[str]:
    lines = ["| strategy | geomean speedup (ours) | thesis | diff (pp) | max (ours) | thesis |"
             " diff (pp) | DRAM traffic mean / max change |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for s, v in summ.items():
        th = THESIS.get(s)
        g_th, m_th = (f"{100 * th[0]:.0f}%", f"{100 * th[1]:.0f}%") if th else ("-", "-")
        gd = f"{100 * (v['geomean'] - th[0]):+.1f}" if th else "-"
        md = f"{100 * (v['max'] - th[1]):+.1f}" if th else "-"
        lines.append(f"| {s} | {100 * v['geomean']:.1f}% | {g_th} | {gd} | {100 * v['max']:.1f}%"
                     f" | {m_th} | {md} | {_pct(v['dram_mean'])} / {_pct(v['dram_max'])} |")
    return lines


def acceptance(summ: dict[str, dict[str, float]]) -> list[str]:
    """The issue's checks: within 5 pp of the thesis, and the ordering of the geomeans."""
    lines = []
    for s, (g, _) in THESIS.items():
        d = summ[s]["geomean"] - g
        lines.append(f"- {s}: geomean {100 * summ[s]['geomean']:.1f}% vs thesis {100 * g:.0f}%"
                     f" ({100 * d:+.1f} pp): {'within' if abs(d) <= 0.05 else 'OUTSIDE'} 5 pp")
    t3, mca, nmc = (summ[k]["geomean"] for k in ("t3", "t3-mca", "ideal+nmc"))
    ok = 0 < t3 < mca <= nmc + 1e-12
    lines.append(f"- ordering sequential < t3 < t3-mca <= ideal+nmc: 0 < {100 * t3:.1f}% < "
                 f"{100 * mca:.1f}% <= {100 * nmc:.1f}%: {'holds' if ok else 'VIOLATED'}")
    return lines


def case_tables(rows: list[dict[str, Any]]) -> list[str]:
    """Sequential time split (Fig. 8.13) and speedup per strategy (Fig. 8.14) per case."""
    cases = _cases(rows)
    head = ["| model | tp | sub-layer | stages | GEMM | RS | AG | sequential us | "
            + " | ".join(ORDER) + " |", "|---|---:|---|---:|---:|---:|---:|---:|"
            + "---:|" * len(ORDER)]
    for (model, tp, sub), c in sorted(cases.items()):
        q = c["sequential"]
        tot = q["gemm_s"] + q["rs_s"] + q["ag_s"]
        split = " | ".join(f"{100 * q[k] / tot:.0f}%" for k in ("gemm_s", "rs_s", "ag_s"))
        sps = " | ".join(f"{c[s]['speedup']:.2f}" if s in c else "-" for s in ORDER)
        head.append(f"| {model} | {tp} | {sub} | {q['n_stages']} | {split} | "
                    f"{q['time_s'] * 1e6:.0f} | {sps} |")
    return head


def dram_table(rows: list[dict[str, Any]]) -> list[str]:
    """Mean DRAM traffic per op and direction, per strategy (Fig. 8.16), in MB per rank."""
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by[r["strategy"]].append(r)
    lines = ["| strategy | " + " | ".join(DRAM_KEYS) + " | total |",
             "|---|" + "---:|" * (len(DRAM_KEYS) + 1)]
    for s in ("sequential",) + ORDER:
        if s in by:
            mean = {k: sum(r[k] for r in by[s]) / len(by[s]) / 1e6
                    for k in DRAM_KEYS + ("dram_total",)}
            lines.append(f"| {s} | " + " | ".join(f"{mean[k]:.1f}" for k in DRAM_KEYS)
                         + f" | {mean['dram_total']:.1f} |")
    return lines


def _ratio_geomean(cs: list[dict[str, dict[str, Any]]], num: tuple[str, ...], a: str,
                   den: tuple[str, ...], b: str) -> float:
    """Geomean over cases of sum(num keys of strategy a) / sum(den keys of strategy b)."""
    vals = []
    for c in cs:
        d = sum(c[b][k] for k in den)
        if d <= 0:
            return math.nan            # e.g. no T3 RS reads at tp=2: the ratio is undefined
        vals.append(sum(c[a][k] for k in num) / d)
    return geomean(vals)


def ratios(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Derived checks the thesis states (8.5.1.1, 8.5.2)."""
    cases = _cases(rows)
    out: dict[str, float] = {}
    writes = ("gemm_write", "rs_write")
    for tp in sorted({k[1] for k in cases}):
        cs = [c for k, c in cases.items() if k[1] == tp]
        out[f"nmc_rs_speedup_tp{tp}"] = _ratio_geomean(cs, ("rs_s",), "sequential",
                                                       ("rs_s",), "ideal+nmc") - 1
        out[f"rs_read_ratio_tp{tp}"] = _ratio_geomean(cs, ("rs_read",), "sequential",
                                                      ("rs_read",), "t3-mca")
        out[f"write_cut_tp{tp}"] = 1 - _ratio_geomean(cs, writes, "t3-mca", writes,
                                                      "sequential")
        out[f"gemm_read_ratio_tp{tp}"] = _ratio_geomean(cs, ("gemm_read",), "sequential",
                                                        ("gemm_read",), "t3-mca")
    named = {"mega_op_tp16_ideal": ("mega-gpt2", 16, "OP-fwd"),
             "tnlg_fc1_tp16_ideal": ("t-nlg", 16, "FC-1-bwd")}
    for key, case in named.items():
        if case in cases:
            out[key] = cases[case]["ideal"]["speedup"] - 1
    return out


def _plt() -> Any:
    """matplotlib.pyplot on the Agg backend, imported only when a report is written."""
    import matplotlib  # noqa: PLC0415
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    return plt


def plot_speedups(rows: list[dict[str, Any]], path: Path) -> None:
    """Grouped bars: speedup over sequential per case and strategy (thesis Fig. 8.14)."""
    plt = _plt()
    cases = _cases(rows)
    keys = sorted(cases)
    width = 0.8 / len(ORDER)
    fig, ax = plt.subplots(figsize=(14, 4.8))
    for i, s in enumerate(ORDER):
        ys = [cases[k][s]["speedup"] if s in cases[k] else 0.0 for k in keys]
        ax.bar([j + (i - len(ORDER) / 2 + 0.5) * width for j in range(len(keys))], ys, width,
               label=s)
    for s, (g, _) in THESIS.items():
        ax.axhline(1 + g, ls=":", lw=0.8, color="gray")
        ax.text(len(keys) - 0.5, 1 + g, f"thesis {s} geomean", fontsize=7, va="bottom",
                ha="right", color="gray")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_ylim(0.8, 1.65)
    ax.set_xticks(range(len(keys)))
    ax.set_xticklabels([f"{m}\n{sub}\ntp={tp}" for m, tp, sub in keys], fontsize=7)
    ax.set_ylabel("speedup over sequential")
    ax.set_title("Sliced sub-layers on t3-gpu: GEMM -> RS -> AG (ours; dotted: thesis geomeans)")
    ax.legend(ncol=6, fontsize=8, loc="upper left", framealpha=0.9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_dram(rows: list[dict[str, Any]], path: Path) -> None:
    """Stacked DRAM traffic per strategy, mean over cases (thesis Fig. 8.16)."""
    plt = _plt()
    strategies = ("sequential",) + ORDER
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by[r["strategy"]].append(r)
    fig, ax = plt.subplots(figsize=(8, 4))
    bottom = [0.0] * len(strategies)
    for key in DRAM_KEYS:
        ys = [sum(r[key] for r in by[s]) / max(len(by[s]), 1) / 1e6 for s in strategies]
        ax.bar(strategies, ys, bottom=bottom, label=key)
        bottom = [b + y for b, y in zip(bottom, ys)]
    ax.set_ylim(0, 1.3 * max(bottom))
    ax.set_ylabel("DRAM MB per GPU (mean over sub-layers)")
    ax.set_title("DRAM traffic per op and strategy")
    ax.legend(fontsize=8, ncol=3)
    ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parameter_table() -> list[str]:
    """The preset numbers the overlap models read, with their sources."""
    from ...hw.presets import all_quantities, read_preset  # noqa: PLC0415

    secs = all_quantities(read_preset("t3-gpu"))
    lines = ["| parameter | value (SI) | source |", "|---|---:|---|"]
    for sec in ("compute", "memory", "gemm", "link", "extra"):
        for key, q in secs.get(sec, {}).items():
            lines.append(f"| {sec}.{key} | {q.value:.6g} | {q.source} |")
    return lines


def write_csvs(rows: list[dict[str, Any]], summ: dict[str, dict[str, float]], out: Path
               ) -> None:
    keys = list(rows[0])
    with (out / "sublayers.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: f"{v:.6g}" if isinstance(v, float) else v for k, v in r.items()})
    with (out / "summary.csv").open("w", newline="") as f:
        sw = csv.writer(f)
        sw.writerow(["strategy", "geomean_speedup", "thesis_geomean", "max_speedup",
                    "thesis_max", "dram_change_mean", "dram_change_max"])
        for s, v in summ.items():
            th = THESIS.get(s, (math.nan, math.nan))
            sw.writerow([s, f"{v['geomean']:.4f}", th[0], f"{v['max']:.4f}", th[1],
                        f"{v['dram_mean']:.4f}", f"{v['dram_max']:.4f}"])


def markdown(rows: list[dict[str, Any]], summ: dict[str, dict[str, float]], tps: list[int]
             ) -> list[str]:
    rt = ratios(rows)
    t3m = summ["t3-mca"]
    tp_a, tp_b = (tps + tps)[:2]
    lines = [
        "# T3 sub-layers: fused GEMM + ring reduce-scatter (thesis seed 003, ch. 8.5)", "",
        "Generated by `mpiemu report t3` from timing-only runs of `workloads/t3_sublayers.toml`"
        f" at tp = {', '.join(map(str, tps))} on the `t3-gpu` preset (80 CUs, 16 MB L2, 1 TB/s"
        " HBM2, ring 150 GB/s bidirectional; every parameter and its source is listed at the"
        " end). Speedups are over `sequential` (GEMM, then RS, then AG); each sub-layer is the"
        " row-parallel GEMM of 16K (Mega-GPT-2) or 8K (T-NLG) tokens followed by the ring"
        " all-reduce of its output, as in thesis Fig. 8.13/8.14.", "",
        "## Summary: ours beside the thesis", "", *summary_table(summ), "",
        "Acceptance checks of the issue:", "", *acceptance(summ), "",
        f"Data movement with T3-MCA: {_pct(t3m['dram_mean'])} mean, {_pct(t3m['dram_max'])} "
        f"max (thesis {_pct(THESIS_DRAM[0])} mean, {_pct(THESIS_DRAM[1])} max).", "",
        "![speedups](speedup.png)", "",
        "## Per sub-layer: sequential time split and speedups", "", *case_tables(rows), "",
        "## DRAM traffic per op (MB per GPU, mean over sub-layers)", "", *dram_table(rows), "",
        "![dram](dram.png)", "",
        "## Other numbers the thesis states", "",
        "| quantity | ours | thesis |", "|---|---:|---:|",
    ]
    named = [("Ideal speedup, OP-fwd Mega-GPT-2 tp=16 (8.5.1.1)", "mega_op_tp16_ideal", "15%"),
             ("Ideal speedup, FC-1-bwd T-NLG tp=16 (8.5.1.1)", "tnlg_fc1_tp16_ideal", "50%")]
    for text, key, th in named:
        if key in rt:
            lines.append(f"| {text} | {100 * rt[key]:.1f}% | {th} |")
    per_tp: list[tuple[str, str, str, dict[int, str]]] = [("RS speed-up from NMC, tp={tp} (8.5.1.1)", "nmc_rs_speedup_tp{tp}", "pct",
               {8: "7%", 16: "3%"}),
              ("RS reads, sequential / T3-MCA, tp={tp} (8.5.2)", "rs_read_ratio_tp{tp}", "x",
               {8: "2.5x", 16: "2.2x"}),
              ("GEMM + RS writes cut by T3-MCA, tp={tp} (8.5.2)", "write_cut_tp{tp}", "pct",
               {8: "14%", 16: "7%"}),
              ("GEMM reads, sequential / T3-MCA, tp={tp} (8.5.2)", "gemm_read_ratio_tp{tp}",
               "x", {8: "1.2x", 16: "2x"})]
    for text, key, kind, by_tp in per_tp:
        for tp in (tp_a, tp_b) if tp_a != tp_b else (tp_a,):
            k = key.format(tp=tp)
            if k in rt and math.isfinite(rt[k]):
                v = f"{100 * rt[k]:.1f}%" if kind == "pct" else f"{rt[k]:.2f}x"
                lines.append(f"| {text.format(tp=tp)} | {v} | {by_tp.get(tp, '-')} |")
    lines += ["", "## Where we differ from the thesis, and why", "", *DIFFERENCES,
              *balance_note(rows), "",
              "## Model parameters (preset `t3-gpu`)", "", *parameter_table(), "",
              "Regenerate: `mpiemu report t3 --out results/t3` (about a minute on two cores)."]
    return lines


DIFFERENCES = [
    "- **Model, not simulator.** The thesis runs Accel-Sim cycle by cycle; we charge each GEMM"
    " stage a roofline time and share DRAM between the stage and the ring traffic that lands in"
    " it (`mpiemu/hw/contention.py`, docs/t3.md). Nothing is fitted per sub-layer, model or TP"
    " degree; the assumptions of the preset are marked.",
    "- **Cache behaviour of the GEMMs.** Our LLC model (`mpiemu/hw/gemm.py`) finds the tp=16"
    " GEMMs nearly cache-resident and several tp=8 FC GEMMs thrashing, so T3's uncached output"
    " cuts GEMM reads most at tp=8 (the thesis: 1.2x at tp=8, 2x at tp=16). GEMM read volume"
    " decides how much the ring traffic stalls a GEMM, so per-case T3 numbers differ from"
    " Fig. 8.14 even where the geomeans agree.",
    "- **Stall exposure.** Under the baseline round-robin controller each critical GEMM access"
    " waits for two communication accesses (a queue entry held by a burst, then the"
    " alternation); with one instead of two, T3's geomean rises by about 8 pp. T3-MCA's"
    " exposure is threshold/queue entries. These are derivations from the policy, not fits;"
    " docs/t3.md gives the sensitivity.",
    "- **T3-MCA on OP.** Compute-first arbitration starves the ring while an OP GEMM, whose"
    " near-memory-updated output saturates DRAM, runs; with our assumed starvation limit"
    " (8 DRAM cycles) T3-MCA is slower than T3 on the tp=16 OP sub-layers.",
    "- **Software overlap.** sw-overlap is a full fused schedule with contention and"
    " dependencies, not Fig. 8.4's max(GEMM on A CUs, AR on B CUs): with fewer CUs the GEMM"
    " runs more waves (64 CUs: +20%, as Fig. 8.4's 21%) and the communication kernel, limited"
    " by its CUs' assumed bandwidth, slows on 8 CUs; its cached output keeps GEMM reads"
    " exposed to the ring traffic.",
]


def balance_note(rows: list[dict[str, Any]]) -> list[str]:
    """The two cases the thesis names for GEMM-vs-RS balance (8.5.1.1), with our times."""
    cases = _cases(rows)
    a, b = ("mega-gpt2", 16, "OP-fwd"), ("t-nlg", 16, "FC-1-bwd")
    if a not in cases or b not in cases:
        return []
    qa, qb = cases[a]["sequential"], cases[b]["sequential"]
    return [f"- **Per-case ideal speedups** follow from GEMM vs RS times alone. Mega-GPT-2 "
            f"OP tp=16 (GEMM {qa['gemm_s'] * 1e6:.0f} us, RS {qa['rs_s'] * 1e6:.0f} us) gets "
            f"{100 * (cases[a]['ideal']['speedup'] - 1):.1f}% (thesis 15%); T-NLG FC-1 tp=16 "
            f"(GEMM {qb['gemm_s'] * 1e6:.0f} us, RS {qb['rs_s'] * 1e6:.0f} us) gets "
            f"{100 * (cases[b]['ideal']['speedup'] - 1):.1f}% where the thesis, with GEMM ~ RS,"
            " gets 50%. One matrix-unit efficiency for every GEMM (preset gemm.efficiency) "
            "cannot make both GEMM/RS ratios match; we do not tune it per case."]


def main(out_dir: Path, argv: list[str]) -> int:
    """Run the sweeps, write the report; returns a process exit code."""
    args = _args(argv)
    out_dir = Path(args.out) if args.out else out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = Path(args.keep_runs) if args.keep_runs else Path(tempfile.mkdtemp(prefix="t3-"))
    try:
        rows = [r for tp in args.tp for r in run_sweep(tp, args, runs)]
    finally:
        if not args.keep_runs:
            shutil.rmtree(runs, ignore_errors=True)
    summ = summarize(rows)
    write_csvs(rows, summ, out_dir)
    plot_speedups(rows, out_dir / "speedup.png")
    plot_dram(rows, out_dir / "dram.png")
    (out_dir / "README.md").write_text("\n".join(markdown(rows, summ, args.tp)) + "\n")
    sys.stdout.write("\n".join(summary_table(summ) + [""] + acceptance(summ)) + "\n")
    sys.stdout.write(f"wrote {out_dir}/README.md, sublayers.csv, summary.csv, speedup.png, "
                     "dram.png\n")
    return 0

"""`mpiemu report sunway`: SWattention vs standard attention and SwFormer scheduling, ours beside
the seeds' figures (SWA = seed 001, SwFormer appendix = seed 000).

Everything comes from `SunwayCost`, the model Sunway ranks use; one process suffices since the
costs are per processor. Writes README.md, attention.csv, seed.csv, schedule.csv, speedup.png,
schedule.png and a one-rank trace of a GPT-3 6.7B-like layer (trace/, for `mpiemu analyze`).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ..devices.presets import load_device
from ..devices.sunway import SunwayCost
from ..devices.sunway.schedule import Schedule
from ..sim.timeline import Timeline
from ..sim.trace import TraceWriter, rank_file
from .common import Golden, write_csv
from .sunway_rows import (FIG, SEQS, attention_rows, fusion_rows, layer_schedules, memory_rows,
                          schedule_rows, seed_rows)

def write_trace(m: SunwayCost, out: Path) -> Path:
    """One Sunway rank's GPT-3 6.7B-like layer, forward then backward under KA."""
    from ..executors.sunway import charge_schedule  # noqa: PLC0415
    run = out / "trace"
    run.mkdir(parents=True, exist_ok=True)
    writer = TraceWriter(rank_file(run, 0), {"rank": 0, "world_size": 1, "tp_rank": 0,
                                             "dp_rank": 0, "device": m.spec.name})
    tl = Timeline(writer)
    t = 0.0
    for p in ("fwd", "bwd"):
        ops, sc = layer_schedules(m, 4, p, coarse=True)
        with tl.labelled(layer=0, phase=p, iteration=0):
            t = charge_schedule(tl, sc["ka"], t, prefix=f"layer0.{p}.",
                                flops={o.name: o.flops for o in ops})
    writer.close(complete=True, attrs={"t_end_emulated": tl.now()})
    (run / "manifest.json").write_text(json.dumps(
        {"status": "complete", "world_size": 1, "config": {"name": "sunway-gpt3-6.7b-layer"},
         "note": "written by `mpiemu report sunway` from SunwayCost; one rank, KA"}, indent=2))
    return run


def golden() -> list[Golden]:
    """Every CSV of the study, regenerated in full (a few seconds: costs only, one process)."""
    m = SunwayCost(load_device("sw26010pro"))
    att = attention_rows(m, SEQS)
    return [Golden("attention.csv", att), Golden("seed.csv", seed_rows(m, att)),
            Golden("schedule.csv", schedule_rows(m)), Golden("fusion.csv", fusion_rows(m))]


def main(out_dir: Path, argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="mpiemu report sunway")
    ap.add_argument("--quick", action="store_true", help="S up to 4k only (for tests)")
    ap.add_argument("--out", type=Path, help="output directory (as `mpiemu report --out`)")
    args = ap.parse_args([a for a in argv if a != "--"])
    out_dir = args.out or out_dir
    m = SunwayCost(load_device("sw26010pro"))
    out_dir.mkdir(parents=True, exist_ok=True)
    seqs = SEQS[:3] if args.quick else SEQS
    att = attention_rows(m, seqs)
    seed = seed_rows(m, att) if not args.quick else []
    sched, fus, mem = schedule_rows(m), fusion_rows(m), memory_rows(m)
    write_csv(out_dir / "attention.csv", att)
    if seed:
        write_csv(out_dir / "seed.csv", seed)
    write_csv(out_dir / "schedule.csv", sched)
    write_csv(out_dir / "fusion.csv", fus)
    write_trace(m, out_dir)
    plot_speedups(att, out_dir / "speedup.png")
    plot_schedule(layer_schedules(m, 4, "bwd", coarse=True)[1], out_dir / "schedule.png")
    from .sunway_report import markdown  # noqa: PLC0415
    (out_dir / "README.md").write_text("\n".join(markdown(m, att, seed, sched, fus, mem)) + "\n")
    print(f"wrote {out_dir}/README.md and CSV/PNG beside it")
    return 0


# --- plots --------------------------------------------------------------------------------------
PAPER_MEANS = {("fp32", "fwd"): ("fp32_fwd_speedup", (SEQS[0], SEQS[3])),
               ("fp32", "bwd"): ("fp32_bwd_speedup", (SEQS[0], SEQS[3])),
               ("fp16", "fwd"): ("fp16_fwd_speedup", (SEQS[2], SEQS[3]))}


def plot_speedups(rows: list[dict[str, Any]], path: Path) -> None:
    """Speedup of SWattention over standard attention vs S; the seed's means dashed."""
    import matplotlib  # noqa: PLC0415
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    fig, axes = plt.subplots(2, 2, figsize=(10, 7), sharex=True)
    for ax, (dtype, p) in zip(axes.flat, [("fp32", "fwd"), ("fp32", "bwd"), ("fp16", "fwd"),
                                          ("fp16", "bwd")]):
        for h, color in ((64, "tab:blue"), (128, "tab:orange")):
            pts = [r for r in rows if (r["dtype"], r["pass_"], r["H"]) == (dtype, p, h)]
            ok = [r for r in pts if r["speedup"] is not None]
            ax.plot([r["S"] for r in ok], [r["speedup"] for r in ok], "o-", color=color,
                    label=f"ours H={h}")
            for r in pts:
                if r["speedup"] is None:
                    ax.annotate("OOM", (r["S"], 1.0), color=color, ha="center")
            if (dtype, p) in PAPER_MEANS:
                name, (lo, hi) = PAPER_MEANS[(dtype, p)]
                ax.hlines(FIG[name].value[f"h{h}"], lo, hi, colors=color, linestyles="dashed",
                          label=f"SWA mean H={h}")
        ax.set_xscale("log", base=2)
        ax.set_title(f"{dtype} {p}, B=3 N=8")
        ax.set_ylabel("speedup over standard")
        ax.axhline(1.0, color="grey", lw=0.5)
        ax.legend(fontsize=7)
    for ax in axes[1]:
        ax.set_xlabel("sequence length S")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_schedule(scheds: dict[str, Schedule], path: Path) -> None:
    """Which op ran on which CG: intra-op vs KA for the GPT-3 6.7B-like backward layer."""
    import matplotlib  # noqa: PLC0415
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    names = sorted({s.op for sc in scheds.values() for s in sc.segments})
    cmap = plt.get_cmap("tab20")
    color = {n: cmap(i % 20) for i, n in enumerate(names)}
    pols = [p for p in ("intra", "ka") if p in scheds]
    fig, axes = plt.subplots(len(pols), 1, figsize=(11, 2.2 * len(pols)), sharex=True)
    for ax, pol in zip(axes, pols):
        for seg in scheds[pol].segments:
            ax.broken_barh([(seg.start * 1e3, (seg.end - seg.start) * 1e3)], (seg.cg - 0.4, 0.8),
                           color=color[seg.op])
        ax.set_yticks(range(6), [f"cg{c}" for c in range(6)])
        ax.set_title(f"{pol}: makespan {scheds[pol].makespan * 1e3:.1f} ms", fontsize=9)
    axes[-1].set_xlabel("emulated ms")
    handles = [plt.Rectangle((0, 0), 1, 1, color=color[n]) for n in names]
    fig.legend(handles, names, loc="upper right", fontsize=6, ncol=2)
    fig.tight_layout(rect=(0, 0, 0.86, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)

"""`mpiemu report sunway`: SWattention vs standard attention and SwFormer scheduling, ours beside
the seeds' figures (SWA = seed 001, SwFormer appendix = seed 000).

Everything comes from `SunwayModel`, the model Sunway ranks use; one process suffices since the
costs are per processor. Writes README.md, attention.csv, seed.csv, schedule.csv, speedup.png,
schedule.png and a one-rank trace of a GPT-3 6.7B-like layer (trace/, for `mpiemu analyze`).
"""
from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path
from typing import Any

from ...hw.presets import load_device
from ...hw.sunway import SunwayModel
from ...hw.sunway.schedule import Schedule
from ...hw.sunway.validate import (SEQS, attention_rows, fusion_rows, layer_schedules,
                                   memory_rows, schedule_rows, seed_rows)
from ...sim.timeline import Timeline
from ...sim.trace import TraceWriter, rank_file

def write_trace(m: SunwayModel, out: Path) -> Path:
    """One Sunway rank's GPT-3 6.7B-like layer, forward then backward under KA."""
    from ...nn.swattention import charge_schedule  # noqa: PLC0415
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
         "note": "written by `mpiemu report sunway` from SunwayModel; one rank, KA"}, indent=2))
    return run


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})


def main(out_dir: Path, argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="mpiemu report sunway")
    ap.add_argument("--quick", action="store_true", help="S up to 4k only (for tests)")
    ap.add_argument("--out", type=Path, help="output directory (as `mpiemu report --out`)")
    args = ap.parse_args([a for a in argv if a != "--"])
    out_dir = args.out or out_dir
    m = SunwayModel(load_device("sw26010pro"))
    out_dir.mkdir(parents=True, exist_ok=True)
    seqs = SEQS[:3] if args.quick else SEQS
    att = attention_rows(m, seqs)
    seed = seed_rows(m, att) if not args.quick else []
    sched, fus, mem = schedule_rows(m), fusion_rows(m), memory_rows(m)
    _write_csv(out_dir / "attention.csv", att)
    if seed:
        _write_csv(out_dir / "seed.csv", seed)
    _write_csv(out_dir / "schedule.csv", sched)
    _write_csv(out_dir / "fusion.csv", fus)
    write_trace(m, out_dir)
    plot_speedups(att, out_dir / "speedup.png")
    plot_schedule(layer_schedules(m, 4, "bwd", coarse=True)[1], out_dir / "schedule.png")
    (out_dir / "README.md").write_text("\n".join(markdown(att, seed, sched, fus, mem)) + "\n")
    print(f"wrote {out_dir}/README.md and CSV/PNG beside it")
    return 0


# --- plots --------------------------------------------------------------------------------------
PAPER_MEANS = {("fp32", "fwd"): ({64: 3.42, 128: 2.21}, (1024, 8192)),
               ("fp32", "bwd"): ({64: 1.94, 128: 1.33}, (1024, 8192)),
               ("fp16", "fwd"): ({64: 2.74, 128: 2.35}, (4096, 8192))}


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
                means, (lo, hi) = PAPER_MEANS[(dtype, p)]
                ax.hlines(means[h], lo, hi, colors=color, linestyles="dashed",
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


# --- Markdown -----------------------------------------------------------------------------------
def _f(x: Any, fmt: str = ".2f") -> str:
    return "OOM" if x is None else format(x, fmt) if isinstance(x, float) else str(x)


def _seed_md(seed: list[dict[str, Any]]) -> list[str]:
    out = ["| figure | ours | seed | diff | source | acceptance |", "|---|---:|---:|---:|---|---|"]
    for r in seed:
        ok = ("yes" if abs(r["rel"]) <= 0.2 else "NO") if r["required"] else ""
        out.append(f"| {r['figure']} | {r['ours']} | {r['seed']} | {r['diff']} | "
                   f"{r['source']} | {ok} |")
    return out


def _attention_md(att: list[dict[str, Any]]) -> list[str]:
    out = ["| dtype | H | S | pass | Br x Bc | SWattention ms | TFLOPS | standard ms | speedup |",
           "|---|---:|---:|---|---|---:|---:|---:|---:|"]
    for r in att:
        out.append(f"| {r['dtype']} | {r['H']} | {r['S']} | {r['pass_']} | {r['br']}x{r['bc']} "
                   f"| {r['sw_ms']:.1f} | {r['sw_tflops']:.2f} | {_f(r['std_ms'], '.1f')} | "
                   f"{_f(r['speedup'])} |")
    return out


def _schedule_md(sched: list[dict[str, Any]], fus: list[dict[str, Any]]) -> list[str]:
    out = ["| GEMM tiles | micro-batch | pass | intra ms | OPT2 ms | KA ms | OPT2 GEMM speedup "
           "| KA speedup |", "|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in sched:
        out.append(f"| {r['tiles']} | {r['batch']} | {r['pass_']} | {r['intra_ms']:.1f} | "
                   f"{r['opt2_ms']:.1f} | {r['ka_ms']:.1f} | {r['opt2_gemm_speedup']:.3f} | "
                   f"{r['ka_speedup']:.3f} |")
    out += ["", "| GEMM M x N x K (FP32) | pad-free ms | idle CGs in last wave | fused ms | gain |",
            "|---|---:|---:|---:|---:|"]
    for r in fus:
        out.append(f"| {r['m']} x {r['n']} x {r['k']} | {r['pad_free_ms']:.2f} | "
                   f"{r['tail_idle_cgs']} | {r['fused_ms']:.2f} | "
                   f"{r['pad_free_ms'] / r['fused_ms'] - 1:+.0%} |")
    return out


def markdown(att: list[dict[str, Any]], seed: list[dict[str, Any]], sched: list[dict[str, Any]],
             fus: list[dict[str, Any]], mem: list[dict[str, Any]]) -> list[str]:
    lines = [
        "# Sunway SW26010pro: SWattention vs standard attention, SwFormer scheduling",
        "",
        "Generated by `mpiemu report sunway` (one process, a few seconds) from `SunwayModel`, the "
        "cost model Sunway ranks use (`mpiemu/hw/sunway/`, preset `sw26010pro`). SWA = seed "
        "001 (SWattention, J. Supercomputing 2024); SWF = seed 000 (SwFormer appendix). The "
        "model and every assumption: `docs/sunway.md`. No number below is fitted per point: "
        "the same constants produce every row.",
        "",
        "## 1. The seeds' figures beside ours",
        "",
        "`acceptance` marks the speedups that must lie within 20% of the seed (B=3, N=8, "
        "causal, dropout on, masked blocks not skipped).",
        "",
        *_seed_md(seed),
        "",
        "![speedups](speedup.png)",
        "",
        "## 2. SWattention and standard attention, B=3 N=8 (per processor, all-shared mode)",
        "",
        *_attention_md(att),
        "",
        "## 3. Memory: where standard attention does not fit in 96 GB",
        "",
        "| case | needs GB | fits |", "|---|---:|---|",
        *[f"| {r['case']} | {r['need_GB']:.1f} | {r['fits']} |" for r in mem],
        "",
        "SWA 4.2 reports standard attention OOM at S=16k (B=3, N=8) and SWA 4.4 the 3.9B model "
        "OOM at S=8k without SWattention while the 2.1B model trains: the model agrees. The "
        "training step of standard attention holds up to five [B,N,S,S] tensors (P, dropout "
        "noise and P dropped saved by the forward; dP dropped and a contiguous transpose in the "
        "backward); SWattention holds O(S H) per head.",
        "",
        "## 4. SwFormer inter-op scheduling on a GPT-3 6.7B-like layer (s2t8, FP32)",
        "",
        "Hidden 4096, 32 heads (4 per processor at TP=8), head dim 128, FFN 16384, S=2048; "
        "micro-batch 4 is SWF's s2t8b4. `8x8 mesh` is our default micro-kernel rule (tile sides "
        "multiples of 8: 54-104 valid pad-free tilings per GEMM, SWF says 50-100); `min "
        "512x512` is a coarser rule for comparison, since SWF's constraints are not in the "
        "appendix. SWF: OPT2 speeds GEMM kernels up 10-15%, KA gives 1.10x on GPT-3 backward "
        "and 1.15x on MMGPT forward (MMGPT's configuration is not in the text: not modelled). "
        "Tile fusion: SWF reports about 5%.",
        "",
        *_schedule_md(sched, fus),
        "",
        "![schedule](schedule.png)",
        "",
        "`trace/` holds one rank's trace of this layer (forward, then backward under KA): "
        "`mpiemu analyze results/sunway/trace` lists each op's per-CG events (`cgK` "
        "resources) and its `.cgs` span naming the CGs it used.",
        "",
        "## 5. Where and why we differ",
        "",
        "* **FP32 speedups vs S.** Our speedup is nearly flat in S (the standard chain and "
        "SWattention are both quadratic), SWA's grows with S; SWA's fwd+bwd throughput grows "
        "1.18 -> 2.76 TFLOPS from 1k to 8k, ours 2.07 -> 2.86. A term linear in S per head "
        "(K and V loaded by each of the 64 CPEs, `kv_dma_copies = 64`) would give that growth, "
        "but then the kernel cannot reach SWA's 2.4 TFLOPS at S=2048 (K/V alone are 3.2 GB per "
        "24 heads). We keep one broadcast copy; the means over 1k-8k stay within 10%.",
        "* **FP16 baseline.** SWA does not say how its mixed-precision PyTorch attention stores "
        "tensors. We follow Megatron-LM's unfused softmax with softmax in FP32 (casts around "
        "mask and softmax, dropout in FP16). With FP16 tensors everywhere the same model gives "
        "forward speedups of 1.49 (H=128) and 1.85 (H=64) at S=4k-8k; the seed's 2.35 / 2.74 "
        "lie between the two readings, ours above by 9% / 17%.",
        "* **FP16 backward at S=2k.** With Br=64 only S/(64 Br) = 1/2 of the CPEs have a Q "
        "block (SWA 3.3's rule), so our 2k backward is slow; SWA calls only S=1k suboptimal.",
        "* **Async DMA in the backward** (ours 1.4x, SWA 1.1x). At Br=16 each block moves four "
        "8 KiB Br x H blocks in and one out per CPE for five 16x64x128 GEMMs; at SWA's own "
        "measured DMA rates that traffic is as long as the GEMMs, so overlapping it must gain "
        "more than 1.1x in a lockstep model. The forward (1.10x) matches.",
        "* **RMA tree share** (21% / 12% vs 24% / 16%): the per-round synchronisation cost is an "
        "assumption (1 us); the trend with S matches.",
        "* **OPT2 / KA.** With our default tiling rule the best pad-free tilings have many small "
        "tiles (64 tiles: 2 of 6 CGs idle for one tile time out of 11), so OPT2 gains only a "
        "few percent; under the coarse rule tails are longer and OPT2 gains 8-11%, KA 1.07-1.12x "
        "on the backward, in SWF's range. The forward of GPT-3 has no independent ops, so "
        "neither policy changes it (SWF evaluates KA on GPT-3 backward and MMGPT forward).",
        "* **Tile fusion** gains more than SWF's ~5% for small K (the C store is a large part "
        "of a tile and fusion overlaps it with the next sub-tile); SWF's heuristic is not in "
        "the appendix, ours is documented in `gemm.py`.",
        "",
        "## Files",
        "",
        "`attention.csv` (section 2), `seed.csv` (section 1), `schedule.csv` and `fusion.csv` "
        "(section 4), `speedup.png`, `schedule.png`, `trace/`.",
    ]
    return lines

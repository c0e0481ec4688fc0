"""`main`, plot and Markdown of `mpiemu report llama` (`llama.py` runs it; every number in
the README generated from the rows, llama_measured.toml and llama.toml)."""
from __future__ import annotations

import re
import statistics
import time
from pathlib import Path
from typing import Any

from . import llama
from .measured_report import agreement, emulated, num, report_args, sentences
from .common import (Row, load_figures, md_table, out_dir_of, pct, plt, runs_dir, signed_pct,
                     write_csv)

UNITS = {"step_time_s": "s / step", "tokens_per_s_per_gpu": "tokens/s/GPU",
         "model_tflops_per_gpu": "model TFLOP/s/GPU"}


def _layout(r: Row) -> str:
    vp = f" VP{r['vp']}" if int(r["vp"]) > 1 else ""
    sp = " +SP" if r["sequence_parallel"] else ""
    return (f"TP{r['tp']} PP{r['pp']} CP{r['cp']}{vp} DP{r['dp']}{sp}, mb {r['micro_batch']} "
            f"gb {r['global_batch']} seq {r['seq_len']}, {r['recompute']}, ZeRO-{r['zero']}")


def headline(rows: list[Row]) -> str:
    """How many emulated rows fall in the band, the median and worst |difference|: all of
    them, then those whose layout the notes state in full."""
    band = float(load_figures("llama")["band"].value)
    em = emulated(rows)
    if not em:
        return "No row was emulated."
    stated = [r for r in em if not r["placeholders"]]
    out = (f"Emulated rows, on each row's own metric: {agreement(em, band)}. "
           f"{len(rows) - len(em)} of the {len(rows)} BF16 rows are not emulated (below).")
    if stated and len(stated) < len(em):
        out += (f" Leaving out the {len(em) - len(stated)} rows whose notes call layout values "
                f"placeholders (marked *): {agreement(stated, band)}.")
    return out


def _by_framework(rows: list[Row]) -> list[str]:
    band = float(load_figures("llama")["band"].value)
    out = []
    for fw in dict.fromkeys(r["framework"] for r in rows):
        mine = [r for r in rows if r["framework"] == fw]
        em = emulated(mine)
        diffs = [r["tokens_difference"] for r in em]
        out.append([fw, len(mine), len(em), sum(abs(r["difference"]) <= band for r in em),
                    signed_pct(statistics.median(diffs)) if diffs else "-"])
    return md_table(["framework", "BF16 rows", "emulated", f"within {pct(band, 0)}",
                     "median tokens/s/GPU difference"], out, "lrrrr")


def _table(rows: list[Row]) -> list[str]:
    out = []
    for r in rows:
        unit = UNITS[r["metric"]]
        ours = "-" if r["ours"] is None else num(r["ours"])
        diff = "not emulated" if r["ours"] is None else signed_pct(r["difference"])
        diff += " *" if r["placeholders"] else ""
        tok = (f"{r['measured_tokens_per_s_per_gpu']:,.0f} / " +
               ("-" if r["ours"] is None else f"{r['ours_tokens_per_s_per_gpu']:,.0f}"))
        mfu = "-" if r["measured_mfu"] is None else pct(r["measured_mfu"])
        mfu += " / " + ("-" if r["ours_mfu"] is None else pct(r["ours_mfu"]))
        mfu += " / " + ("-" if r["ours_mfu_their_count"] is None
                        else pct(r["ours_mfu_their_count"]))
        out.append([f"`{r['id']}`", r["framework"], r["model"], r["gpus"], _layout(r),
                    f"{num(r['measured'])} {unit}", ours, diff, tok, mfu])
    return md_table(["row", "framework", "model", "GPUs", "layout", "measured", "ours",
                     "difference", "tokens/s/GPU measured / ours",
                     "MFU stated / ours (our count) / ours (their count)"], out,
                    "lllrllrrrr")


def _breakdown(rows: list[Row]) -> list[str]:
    """Rank 0's iteration of each distinct emulated run: where the time goes."""
    out = []
    for r in emulated(rows):
        if r["shared_run"] != r["id"]:
            continue
        step = r["ours_step_s"]
        out.append([f"`{r['id']}`", f"{step:.2f}", pct(r["ours_compute_s"] / step),
                    pct(r["ours_tp_exposed_s"] / step), pct(r["ours_dp_exposed_s"] / step),
                    pct(r["ours_idle_s"] / step), f"{r['memory_GiB']:.1f}",
                    "yes" if r["fits"] else "NO"])
    return md_table(["run", "ours s", "compute", "exposed TP", "exposed DP",
                     "idle (bubble, waits)", "memory GiB (fullest stage)", "fits 80 GiB"],
                    out, "lrrrrrrl")


def _sources(rows: list[Row]) -> list[str]:
    """Per source document: its rows, what its notes say it leaves out, what we assume."""
    fig = load_figures("llama")
    meas = {r["id"]: r for r in llama.measured()}
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        m = meas[r["id"]]
        found = re.search(r"https?://\S+?(?=[,)\s]|$)", m["source"])
        groups.setdefault(found.group(0) if found else m["source"][:80], []).append(m)
    out: list[str] = []
    for url, ms in groups.items():
        left = list(dict.fromkeys(s for m in ms for s in sentences(
            m["notes"], ("NOT STATED", "not stated", "placeholder", "DIFFERS", "NOT a"))))
        ours = list(dict.fromkeys(a["text"] for m in ms for a in fig["assumptions"].value
                                  if m["id"].startswith(a["prefix"])))
        out += [f"* **{ms[0]['framework']}**, {len(ms)} row{'s' if len(ms) > 1 else ''}, "
                f"[{url.split('/')[-1]}]({url}) "
                f"({ms[0]['gpu']}).",
                "  Left out by the source: " + (" ".join(left) if left else
                                                "nothing; every setting is stated or taken "
                                                "from the recipe at the stated commit.")]
        if ours:
            out.append("  We assume: " + " ".join(ours))
    return out


def _why(rows: list[Row], what_if: list[Row]) -> list[str]:
    """Where the emulated pipelined runs lose time, and what the rows do not model."""
    em = emulated(rows)
    out = ["## Why the differences", ""]
    tp = [r for r in em if int(r["tp"]) > 1 and r["id"].startswith("dgxc-")]
    if tp:
        share = [r["ours_tp_exposed_s"] / r["ours_step_s"] for r in tp]
        out += [f"Exposed TP communication: in the {len(tp)} emulated DGX Cloud NeMo rows "
                f"with TP > 1, rank 0 waits for TP collectives {pct(min(share))} to "
                f"{pct(max(share))} of the step. Their recipes overlap TP communication with "
                "the GEMMs (userbuffers, `ub_tp_comm_overlap` / TP comm overlap in the notes), "
                "which the emulator does not model: its TP collectives run after their GEMMs "
                "(the backward ones under the weight-gradient GEMMs).", ""]
    if what_if:
        out += ["The DP reduction overlapped with the pipeline: pipelined rows run again "
                "with one setting changed (diagnostics, `llama.toml [what_if]`):", "",
                *md_table(["row", "what if", "measured s", "ours s", "what-if s",
                           "idle ours / what-if s", "exposed DP ours / what-if s"],
                          [[f"`{w['row']}`", w["what_if"], f"{w['measured_step_s']:.2f}",
                            f"{w['ours_step_s']:.2f}", f"{w['what_if_step_s']:.2f}",
                            f"{w['ours_idle_s']:.2f} / {w['what_if_idle_s']:.2f}",
                            f"{w['ours_dp_exposed_s']:.2f} / {w['what_if_dp_exposed_s']:.2f}"]
                           for w in what_if], "llrrrrr"), "",
                "Where the run is faster with the DP reduce-scatter moved after backward, "
                "the overlap costs more than it hides: its bucket messages reserve the NICs "
                "that the CP ring and the pipeline's point-to-point messages cross (TP fills a "
                "node, so CP and PP peers are on other nodes), in issue order "
                "(`sim/calendar.py`), so in the pipeline's cool-down the last micro-batches' "
                "activation gradients queue behind whole buckets and every stage idles; NCCL's "
                "communicators share a NIC concurrently instead. A modelling gap, left visible "
                "(the rows keep the recipe's overlap).", ""]
    tt = [r for r in em if r["framework"] == "torchtitan"]
    if tt:
        out += [f"torchtitan: {len(tt)} rows emulated, median tokens/s/GPU difference "
                f"{signed_pct(statistics.median(r['tokens_difference'] for r in tt))}: they ran "
                "on 96 GB HBM2e H100s capped at 500 W (their gpu field), which no preset models; "
                "torchtitan itself puts these runs' MFU well below NeMo's (notes).", ""]
    ph = [r for r in em if r["placeholders"]]
    if ph:
        idle = [r["ours_idle_s"] / r["ours_step_s"] for r in ph]
        out += [f"Rows with placeholder layouts (*): rank 0 idles {pct(min(idle))} to "
                f"{pct(max(idle))} of the step, mostly the pipeline's bubble under the "
                "placeholder schedule (no interleaving, micro-batches of one), which the notes "
                "say the source did not run as such.", ""]
    return out


def markdown(rows: list[Row], log: list[Row], wall_s: float,
             what_if: list[Row] | None = None) -> list[str]:
    fig = load_figures("llama")
    not_em = [r for r in rows if r["ours"] is None]
    shared = sum(1 for r in emulated(rows) if r["shared_run"] != r["id"])
    folded = sum(1 for x in log if x["processes"] < x["gpus"])
    out = ["# Llama pre-training on H100: emulated vs measured (BF16)", "",
           "Regenerate: `make reports` or `mpiemu report llama` (`--keep-runs DIR --reuse` "
           "rebuilds the tables from runs kept earlier). Every row of "
           "`mpiemu/studies/llama_measured.toml` in BF16 is emulated with its own layout, "
           f"timing only, on the `{fig['device'].value}` device preset and its default "
           "network (`dgx-h100`); nothing is fitted per row. "
           f"This regeneration ran {len(log)} emulated jobs ({folded} folded, "
           f"docs/folding.md) in {wall_s / 60:.1f} minutes of wall time on this machine; "
           f"{shared} rows share a run with an earlier row of the same layout.", "",
           "## Headline", "", headline(rows), "",
           "`difference` = ours / measured - 1 on the row's metric: for a step time, positive "
           "means ours is slower; for tokens/s or model TFLOP/s per GPU, positive means ours is "
           "faster. Tokens/s per GPU are shown both ways for every row (global batch x "
           "sequence / step time / GPUs).", "", *_by_framework(rows), "",
           "![ours vs measured](ours_vs_measured.png)", "",
           "## Every row", "", *_table(rows), "",
           "MFU: as the source states it; ours by our own FLOP count (`training/flops.py`: "
           "Megatron-Core's count, GQA's narrower K and V, SwiGLU's three projections, "
           "attention without the causal halving, the padded vocabulary) over the preset's "
           "dense BF16 peak; and ours in the source's own count "
           f"(`llama.toml [flop_conventions]`: {fig['flop_conventions'].source}).", "",
           "## Where the emulated time goes", "",
           "Rank 0 (the first pipeline stage) of each distinct run, iteration 0:", "",
           *_breakdown(rows), "",
           *_why(rows, what_if or []),
           "## Not emulated", "", *md_table(["row", "GPUs", "why"],
                                            [[f"`{r['id']}`", r["gpus"], r["not_emulated"]]
                                             for r in not_em], "lrl"), "",
           f"The limit: {fig['max_processes'].source}.", "",
           "## What each source leaves out, and what we assume", "",
           "From each row's `notes` in llama_measured.toml (quoted) and this study's "
           "rules (`llama.toml`).", "", *_sources(rows), "",
           "Rules applied to every row: sharding "
           f"({fig['sharding'].source}); sequence parallelism when {fig['sequence_parallel'].value} "
           f"({fig['sequence_parallel'].source}); from the notes: "
           + "; ".join(f"'{x['phrase']}' sets {', '.join(x['sets'])}"
                       for x in fig["note_rules"].value) + ".", ""]
    return out


def fp8_section(fp8: list[Row]) -> list[str]:
    """FP8 against BF16: each published FP8 row's speedup over its BF16 twin, ours beside
    it (both emulated on the same layout, the FP8 one with its recipe)."""
    band = float(load_figures("llama")["band"].value)
    em = [r for r in fp8 if r["ours_speedup"] is not None]
    out = ["## FP8 against BF16", "",
           f"{len(fp8)} FP8 rows in llama_measured.toml; {len(em)} have an emulated BF16 "
           "twin (the same configuration in BF16) and are run again with an `[fp8]` recipe "
           "(`llama.toml [fp8_recipes]`: "
           f"{load_figures('llama')['fp8_recipes'].source}; + FP8 params: "
           f"{load_figures('llama')['fp8_params'].source}). Speedup = BF16 step / FP8 step, "
           "measured and ours; difference = ours / measured - 1."]
    if em:
        diffs = sorted(abs(r["difference"]) for r in em)
        within = sum(d <= band for d in diffs)
        out += ["", f"**Headline:** median |difference| {pct(diffs[len(diffs) // 2])}; "
                    f"{within} of {len(em)} within {pct(band, 0)}; ours "
                    f"{min(r['ours_speedup'] for r in em):.2f}-"
                    f"{max(r['ours_speedup'] for r in em):.2f}x against measured "
                    f"{min(r['measured_speedup'] for r in em):.2f}-"
                    f"{max(r['measured_speedup'] for r in em):.2f}x."]
    out += ["", *md_table(["FP8 row", "GPUs", "recipe", "measured BF16 s", "measured FP8 s",
                           "measured speedup", "ours speedup", "difference"],
                          [[f"`{r['id']}`", r["gpus"], r["recipe"],
                            _s(r["measured_bf16_step_s"]), _s(r["measured_fp8_step_s"]),
                            _x(r["measured_speedup"]), _x(r["ours_speedup"]),
                            signed_pct(r["difference"]) if r["difference"] is not None
                            else r["not_emulated"]] for r in fp8], "lrlrrrrl"), ""]
    return out


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}x"


def plot(rows: list[Row], path: Path) -> None:
    """Ours against measured tokens/s per GPU, log-log, with the band around y = x."""
    band = float(load_figures("llama")["band"].value)
    em = emulated(rows)
    pyplot = plt()
    fig, ax = pyplot.subplots(figsize=(7, 6))
    lo = min(min(r["measured_tokens_per_s_per_gpu"], r["ours_tokens_per_s_per_gpu"])
             for r in em) / 1.5
    hi = max(max(r["measured_tokens_per_s_per_gpu"], r["ours_tokens_per_s_per_gpu"])
             for r in em) * 1.5
    xs = [lo, hi]
    ax.fill_between(xs, [x * (1 - band) for x in xs], [x * (1 + band) for x in xs],
                    color="0.85", label=f"±{pct(band, 0)}")
    ax.plot(xs, xs, color="0.4", lw=1)
    for i, fw in enumerate(dict.fromkeys(r["framework"] for r in em)):
        mine = [r for r in em if r["framework"] == fw]
        ax.scatter([r["measured_tokens_per_s_per_gpu"] for r in mine],
                   [r["ours_tokens_per_s_per_gpu"] for r in mine], label=fw,
                   marker="os^Dv<>"[i % 7], s=30)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured tokens/s per GPU")
    ax.set_ylabel("emulated tokens/s per GPU")
    ax.set_title("Llama BF16 pre-training on H100: emulated vs measured")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    pyplot.close(fig)


def main(out_dir: Path, argv: list[str]) -> int:
    args = report_args("llama", llama.__doc__, argv)
    out_dir = out_dir_of(args, out_dir)
    t0 = time.perf_counter()
    with runs_dir(args, "mpiemu-llama-") as runs:
        rows, log = llama.study_rows(runs, reuse=args.reuse)
        what_if = llama.what_if_rows(runs, rows, reuse=args.reuse)
        fp8 = llama.fp8_rows(runs, rows, reuse=args.reuse)
    wall = time.perf_counter() - t0
    write_csv(out_dir / "rows.csv", rows)
    if log:
        write_csv(out_dir / "runs.csv", log)
    if what_if:
        write_csv(out_dir / "what_if.csv", what_if)
    write_csv(out_dir / "fp8.csv", fp8)
    plot(rows, out_dir / "ours_vs_measured.png")
    (out_dir / "README.md").write_text("\n".join(markdown(rows, log, wall, what_if)
                                                  + fp8_section(fp8)) + "\n")
    print(f"wrote {out_dir}/README.md, rows.csv, runs.csv, what_if.csv, fp8.csv, "
          "ours_vs_measured.png "
          f"({wall / 60:.1f} min)")
    return 0

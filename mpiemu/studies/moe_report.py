"""`main`, plot and Markdown of `mpiemu report moe` (`moe.py` runs it; every number in the
README generated from the rows, moe_measured.toml, moe.toml and the presets)."""
from __future__ import annotations

import re
import statistics
import time
from pathlib import Path
from typing import Any

from . import moe, moe_rows
from .measured_report import agreement, emulated, num, report_args, sentences
from .common import Row, md_table, out_dir_of, pct, plt, runs_dir, signed_pct, write_csv

UNITS = {"step_time_s": "s / step", "tokens_per_s_per_gpu": "tokens/s/GPU",
         "model_tflops_per_gpu": "model TFLOP/s/GPU"}
# not-emulated reasons by kind, in the order the README counts them
KINDS = (("no preset", "no preset"),
         ("refuses the layout", "the emulator refuses the layout"),
         ("MPI processes", "does not fold; more processes than the study's limit"))


def _layout(r: Row) -> str:
    vp = f" VP{r['vp']}" if int(r["vp"]) > 1 else ""
    sp = " +SP" if r["sequence_parallel"] else ""
    etp = f" ETP{r['etp']}" if int(r["etp"]) > 1 else ""
    fp8 = f", FP8 {r['fp8_recipe']}" if r.get("fp8_recipe", "off") != "off" else ""
    return (f"TP{r['tp']} PP{r['pp']} CP{r['cp']}{vp} DP{r['dp']} EP{r['ep']}{etp}{sp}, "
            f"mb {r['micro_batch']} gb {r['global_batch']} seq {r['seq_len']}{fp8}")


def _kind(reason: str) -> str:
    return next((label for key, label in KINDS if key in reason), "other")


def _count(rows: list[Row], kind: str) -> str:
    """How many `kind` rows agree within the band, then why the others were not emulated."""
    band = float(moe.fig("band").value)
    em = emulated(rows)
    kinds: dict[str, int] = {}
    for r in rows:
        if r["ours"] is None:
            kinds[_kind(r["not_emulated"])] = kinds.get(_kind(r["not_emulated"]), 0) + 1
    why = ", ".join(f"{n} {k}" for k, n in kinds.items())
    out = (f"{kind} rows emulated, on each row's own metric: {agreement(em, band)}." if em
           else f"No {kind} row was emulated.")
    return (f"{out} {len(rows) - len(em)} of the {len(rows)} {kind} rows are not emulated"
            + (f" (first reason: {why})." if why else "."))


def headline(rows: list[Row], fp8: list[Row]) -> str:
    """Per precision: the emulated rows in the band and the median |difference|, then why
    the others were not emulated, by kind."""
    return f"{_count(rows, 'BF16')} {_count(fp8, 'FP8')}"


def _by_framework(rows: list[Row]) -> list[str]:
    band = float(moe.fig("band").value)
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
    band = float(moe.fig("band").value)
    out = []
    for r in rows:
        unit = UNITS[r["metric"]]
        ours = "-" if r["ours"] is None else num(r["ours"])
        if r["ours"] is None:
            diff = "not emulated"
        else:
            diff = signed_pct(r["difference"]) + (" (in band)" if abs(r["difference"]) <= band
                                                  else " (outside)")
        tok = (f"{r['measured_tokens_per_s_per_gpu']:,.0f} / " +
               ("-" if r["ours"] is None else f"{r['ours_tokens_per_s_per_gpu']:,.0f}"))
        mfu = "-" if r["measured_mfu"] is None else pct(r["measured_mfu"])
        mfu += " / " + ("-" if r["ours_mfu"] is None else pct(r["ours_mfu"]))
        mfu += " / " + ("-" if r["ours_mfu_their_count"] is None
                        else pct(r["ours_mfu_their_count"]))
        out.append([f"`{r['id']}`", r["framework"], r["model"], r["gpus"], _layout(r),
                    r["routing"], f"{num(r['measured'])} {unit}", ours, diff, tok, mfu])
    return md_table(["row", "framework", "model", "GPUs", "layout", "routing (source)",
                     "measured", "ours", "difference", "tokens/s/GPU measured / ours",
                     "MFU stated / ours (our count) / ours (their count)"], out,
                    "lllrlllrrrr")


def _breakdown(rows: list[Row]) -> list[str]:
    """Rank 0's iteration of each distinct emulated run: where the time goes."""
    out = []
    for r in emulated(rows):
        if r["shared_run"] != r["id"]:
            continue
        step = r["ours_step_s"]
        out.append([f"`{r['id']}`", f"{step:.2f}", pct(r["ours_compute_s"] / step),
                    pct(r["ours_tp_ep_exposed_s"] / step), pct(r["ours_dp_exposed_s"] / step),
                    pct(r["ours_idle_s"] / step), f"{r['memory_GiB']:.1f}",
                    "yes" if r["fits"] else "NO"])
    return md_table(["run", "ours s", "compute", "exposed TP + EP (all-to-all)",
                     "exposed DP", "idle (bubble, waits)", "memory GiB (fullest stage)",
                     "fits 80 GiB"], out, "lrrrrrrl")


def _changes(rows: list[Row]) -> list[str]:
    """Per emulated row: what its emulation changes from what the source ran."""
    out = []
    for r in emulated(rows):
        out.append(f"* `{r['id']}` (ZeRO-{r['zero']}, recompute {r['recompute']}, tokens "
                   f"{r['tokens']}): {r['emulated_with'] or 'nothing'}.")
    return out


def _kv_channels_status() -> str:
    """Whether the Qwen3 presets express their 128-wide heads (model.kv_channels)."""
    from ..model.presets import load_model_preset  # noqa: PLC0415
    parts = []
    for name in ("qwen3-30b-a3b", "qwen3-235b-a22b"):
        cfg, nm = load_model_preset(name).config, moe_rows.not_modelled(name)
        if "head_dim" in nm and cfg.head_dim != int(nm["head_dim"]):
            parts.append(f"`{name}` runs heads of {cfg.head_dim} (hidden / heads) where the "
                         f"model's are {nm['head_dim']} wide (its [not_modelled] head_dim; "
                         "`model.kv_channels` is not in the preset yet)")
        else:
            parts.append(f"`{name}` runs {cfg.heads} heads of {cfg.head_dim} (query width "
                         f"{cfg.heads * cfg.head_dim} over hidden {cfg.hidden})"
                         + ("" if "qk_norm" in nm else " with QK-norm"))
    return "Qwen3 attention: " + "; ".join(parts) + "."


def _flop_checks(checks: list[Row]) -> list[str]:
    return md_table(["row", "count", "printed model TFLOP/s/GPU",
                     "their count x their throughput", "difference"],
                    [[f"`{c['id']}`", c["convention"], f"{c['printed_tflops']:.1f}",
                      f"{c['from_their_throughput']:.1f}", signed_pct(c["difference"], 2)]
                     for c in checks], "llrrr")


def _sources(rows: list[Row]) -> list[str]:
    """Per source document: its rows, what its notes say it leaves out, what we assume."""
    meas = {r["id"]: r for r in moe.measured()}
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        m = meas[r["id"]]
        found = re.search(r"https?://\S+?(?=[,)\s]|$)", m["source"])
        groups.setdefault(found.group(0) if found else m["source"][:80], []).append(m)
    out: list[str] = []
    for url, ms in groups.items():
        left = list(dict.fromkeys(s for m in ms for s in sentences(
            m["notes"], ("NOT STATED", "DISAGREEMENT", "NOT READ"))))
        ours = list(dict.fromkeys(a["text"] for m in ms for a in moe.fig("assumptions").value
                                  if m["id"].startswith(a["prefix"])))
        em = sum(1 for r in rows if r["id"] in {m["id"] for m in ms} and r["ours"] is not None)
        out += [f"* **{framework_of(ms[0])}**, {len(ms)} row{'s' if len(ms) > 1 else ''} "
                f"({em} emulated), [{url.split('/')[-1]}]({url}).",
                "  Left out by the source: " + (" ".join(left) if left else
                                                "nothing flagged in the notes.")]
        if ours and em:
            out.append("  We assume: " + " ".join(ours))
    return out


def framework_of(m: dict[str, Any]) -> str:
    return moe.framework(m)


def _not_emulated(rows: list[Row]) -> list[str]:
    body = [[f"`{r['id']}`", r["model"], r["gpus"], _layout(r), r["not_emulated"]]
            for r in rows if r["ours"] is None]
    return md_table(["row", "model", "GPUs", "layout", "why"], body, "llrll")


def _fp8(fp8: list[Row]) -> list[str]:
    """The FP8 rows: each with its recipe, the same columns as the BF16 rows."""
    rules = "; ".join(f"`{e['prefix']}*`: {e['recipe']} ({e['why']})"
                      for e in moe.fig("fp8_recipes").value)
    return ["## Every FP8 row", "",
            "Each `[[fp8_run]]` row emulated as the BF16 rows are, with its `[fp8]` recipe "
            f"(`moe.toml [fp8_recipes]`: {rules}): the layers' linear GEMMs and the experts' "
            "grouped GEMMs at the FP8 rate with the recipe's casts, a weight cast once a step; "
            "the attention core, the router and the output layer in BF16 (docs/training.md, "
            "Precision).", "", *_table(fp8), ""]


def _why(rows: list[Row]) -> list[str]:
    """Where the emulated time goes, and what the emulation leaves out."""
    em = emulated(rows)
    if not em:
        return []
    out = ["## Why the differences", ""]
    for r in em:
        step = r["ours_step_s"]
        out += [f"`{r['id']}`: ours {step:.2f} s per step against {r['measured_step_s']:.2f} "
                f"s measured; rank 0 computes {pct(r['ours_compute_s'] / step)} of the step "
                f"and waits {pct(r['ours_tp_ep_exposed_s'] / step)} for model-parallel "
                "communication (TP collectives where TP > 1, and the expert all-to-alls: "
                "dispatch and combine in the forward, the backward"
                + (" and the recomputed forward" if r["recompute"] == "full" else "")
                + "), which run as NCCL's all-to-all(v) between the router and the expert GEMMs, "
                "not overlapped with compute; exposed DP communication "
                f"{pct(r['ours_dp_exposed_s'] / step)}, idle {pct(r['ours_idle_s'] / step)}. "
                "What the emulation changes from the source's run is listed below.", ""]
    return out


def markdown(rows: list[Row], fp8: list[Row], log: list[Row], wall_s: float,
             checks: list[Row]) -> list[str]:
    folded = sum(1 for x in log if x["processes"] < x["gpus"])
    out = ["# Mixture-of-Experts pre-training on H100: emulated vs measured (BF16, FP8)", "",
           "Regenerate: `make reports` or `mpiemu report moe` (`--keep-runs DIR --reuse` "
           "rebuilds the tables from runs kept earlier). Every row of "
           "`mpiemu/studies/moe_measured.toml` (BF16, and FP8 with its recipe) is emulated "
           "with its own layout where "
           f"the emulator can express it, timing only, on the `{moe.fig('device').value}` "
           f"device preset and the `{moe.fig('network').value}` network, tokens in perfect "
           f"balance (`moe.tokens = '{moe.fig('tokens').value}'`); nothing is fitted per row. "
           f"This regeneration ran {len(log)} emulated job{'s' if len(log) != 1 else ''} "
           f"({folded} folded, docs/folding.md) in {wall_s / 60:.1f} minutes of wall time on "
           "this machine.", "",
           "## Headline", "", headline(rows, fp8), "",
           "`difference` = ours / measured - 1 on the row's metric: for a step time, positive "
           "means ours is slower; for tokens/s or model TFLOP/s per GPU, positive means ours is "
           "faster. Tokens/s per GPU are shown both ways for every row (global batch x "
           "sequence / step time / GPUs; from a model TFLOP/s figure through the source's own "
           "FLOP count).", "", _kv_channels_status(), "", *_by_framework(rows), "",
           "![ours vs measured](ours_vs_measured.png)", "",
           "## Every BF16 row", "", *_table(rows), "", *_fp8(fp8),
           "MFU: as the source states it (or its model TFLOP/s over 989); ours by our own FLOP "
           "count (`training/flops.py`: the experts a token passes, k routed + shared, no "
           "router, attention without the causal halving, the padded vocabulary) over the "
           "preset's dense BF16 peak; and ours in the source's own count "
           "(`moe.toml [flop_conventions]`).", "",
           "## The sources' FLOP counts, checked", "",
           "Each source's count (`moe.toml [flop_conventions]`) times its own tokens/s "
           "reproduces the model TFLOP/s/GPU it prints:", "", *_flop_checks(checks), "",
           "## Where the emulated time goes", "",
           "Rank 0 (the first pipeline stage) of each distinct run, iteration 0:", "",
           *_breakdown(rows), "", *_why(rows),
           "## What each emulation changes", "",
           "Per emulated row, what differs from what its source ran (generated from the row "
           "and the preset):", "", *_changes(rows), "",
           "## Not emulated", "", *_not_emulated(rows + fp8), "",
           f"The limit: {moe.fig('max_processes').source}. Folding MoE runs: "
           "docs/folding.md (balanced tokens; EP = TP, or TP = 1 and EP = DP; no CP).", "",
           "## What each source leaves out, and what we assume", "",
           "From each row's `notes` in moe_measured.toml (quoted) and this study's rules "
           "(`moe.toml`).", "", *_sources(rows), "",
           "Rules applied to every row: sharding "
           f"({moe.fig('sharding').source}), and with experts and EP or TP > 1 "
           f"ZeRO-{moe.fig('zero_with_experts').value} ({moe.fig('zero_with_experts').source}); "
           f"recomputation ({moe.fig('recompute').source}); sequence parallelism when "
           f"{moe.fig('sequence_parallel').value} ({moe.fig('sequence_parallel').source}); the "
           "row's capacity factor as moe.capacity_factor; from the notes: "
           + "; ".join(f"'{x['phrase']}' sets {', '.join(x['sets'])}"
                       for x in moe.fig("note_rules").value) + ".", ""]
    return out


def plot(rows: list[Row], path: Path) -> None:
    """Ours against measured tokens/s per GPU, log-log, with the band around y = x; the
    rows not emulated as ticks on the measured axis."""
    band = float(moe.fig("band").value)
    em = emulated(rows)
    pyplot = plt()
    fig, ax = pyplot.subplots(figsize=(7, 6))
    allx = [r["measured_tokens_per_s_per_gpu"] for r in rows]
    ys = [r["ours_tokens_per_s_per_gpu"] for r in em]
    lo, hi = min(allx + ys) / 1.5, max(allx + ys) * 1.5
    xs = [lo, hi]
    ax.fill_between(xs, [x * (1 - band) for x in xs], [x * (1 + band) for x in xs],
                    color="0.85", label=f"±{pct(band, 0)}")
    ax.plot(xs, xs, color="0.4", lw=1)
    for i, fw in enumerate(dict.fromkeys(r["framework"] for r in em)):
        mine = [r for r in em if r["framework"] == fw]
        ax.scatter([r["measured_tokens_per_s_per_gpu"] for r in mine],
                   [r["ours_tokens_per_s_per_gpu"] for r in mine], label=fw,
                   marker="os^Dv<>"[i % 7], s=40, zorder=3)
    rest = [r["measured_tokens_per_s_per_gpu"] for r in rows if r["ours"] is None]
    ax.scatter(rest, [lo * 1.05] * len(rest), marker="|", color="0.3", s=120,
               label=f"measured, not emulated ({len(rest)})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured tokens/s per GPU")
    ax.set_ylabel("emulated tokens/s per GPU")
    ax.set_title("MoE BF16 pre-training on H100: emulated vs measured")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    pyplot.close(fig)


def main(out_dir: Path, argv: list[str]) -> int:
    args = report_args("moe", moe.__doc__, argv)
    out_dir = out_dir_of(args, out_dir)
    t0 = time.perf_counter()
    with runs_dir(args, "mpiemu-moe-") as runs:
        rows, log = moe.study_rows(runs, reuse=args.reuse)
        fp8, log8 = moe.study_rows(runs, reuse=args.reuse, fp8=True)
        log += log8
        checks = moe.flop_checks(moe.write_workload(runs))
    wall = time.perf_counter() - t0
    write_csv(out_dir / "rows.csv", rows)
    write_csv(out_dir / "fp8.csv", fp8)
    if log:
        write_csv(out_dir / "runs.csv", log)
    plot(rows, out_dir / "ours_vs_measured.png")
    (out_dir / "README.md").write_text("\n".join(markdown(rows, fp8, log, wall, checks))
                                       + "\n")
    print(f"wrote {out_dir}/README.md, rows.csv, fp8.csv, runs.csv, ours_vs_measured.png "
          f"({wall / 60:.1f} min)")
    return 0

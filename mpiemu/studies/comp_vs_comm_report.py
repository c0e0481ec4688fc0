"""`main`, README and plots of `mpiemu report comp_vs_comm` (`comp_vs_comm.py` runs the
sweeps): every number from the rows, the data file or the preset (none typed here)."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Callable, Iterable

from ..runner.collective_sweep import bus_factor
from . import comp_vs_comm
from .common import Row, md_table, out_dir_of, pct, plt, runs_dir, write_csv
from .comp_vs_comm import dp_busbw, fc_grad_bytes, figures, sweep_network, trend, sweep


def _scales() -> list[str]:
    """The compute scales the thesis gives ranges for (keys of its TP-share figure)."""
    return list(figures()["tp_share"])


def _k(h: int) -> str:
    return f"{h // 1024}K"


def _at(rows: list[Row], scale: str) -> list[Row]:
    return [r for r in rows if r["compute_scale"] == float(scale)]


def _span(vals: list[float]) -> str:
    return f"{pct(min(vals))}-{pct(max(vals))}" if vals else "-"


def _verdict(vals: list[float], lo: float, hi: float) -> str:
    if not vals:
        return "no point run"
    inside = sum(lo <= v <= hi for v in vals)
    return f"{inside} of {len(vals)} inside"


def tp_tables(rows: list[Row]) -> list[str]:
    f = figures()
    hi_rows = [r for r in rows if r["highlighted"]]
    pairs = sorted({(r["hidden"], r["tp"]) for r in hi_rows})
    body = []
    for s in _scales():
        lo, hi = f["tp_share"][s]
        mine = [r["tp_share"] for r in _at(hi_rows, s)]
        named = [r["tp_share"] for r in _at(hi_rows, s) if r["hidden"] >= f["named_min_hidden"]]
        body.append([f"{s}x", f"{pct(lo, 0)}-{pct(hi, 0)}", _span(mine), _verdict(mine, lo, hi),
                     _verdict(named, lo, hi), _span([r["tp_share"] for r in _at(rows, s)])])
    lines = [f"Highlighted pairs run (H / TP = {f['highlighted_h_per_tp']}): "
             + (", ".join(f"H = {_k(h)} at TP = {t}" for h, t in pairs) or "none")
             + f", every SL and B ({len(hi_rows) // len(_scales())} points per scale).", ""]
    lines += md_table(["compute scale", "thesis (highlighted)", "ours (highlighted)",
                       "points inside", f"inside, H >= {_k(f['named_min_hidden'])} (the "
                       "thesis's named models)", "ours, every point run"], body)
    per = [[f"{_k(h)} / {t}", _k(sl)] + [pct(next(r["tp_share"] for r in _at(hi_rows, s)
                                               if (r["hidden"], r["tp"], r["seq_len"],
                                                   r["batch"]) == (h, t, sl, 1)))
                                          for s in _scales()]
           for h, t in pairs for sl in sorted({r["seq_len"] for r in hi_rows})]
    big = max(pairs, default=None)
    tail: list[str] = []
    if big is not None:
        at = [r for r in hi_rows if (r["hidden"], r["tp"]) == big]
        tail = ["", f"At the largest highlighted pair run (H = {_k(big[0])}, TP = {big[1]}): "
                + "; ".join(f"{s}x {_span([r['tp_share'] for r in _at(at, s)])} "
                            f"({_verdict([r['tp_share'] for r in _at(at, s)], *f['tp_share'][s])})"
                            for s in _scales())
                + ". The share grows with H along the highlighted diagonal (the edge (H + SL) / "
                "TP of Eq. 5.6 shrinks as SL stays)"
                + (", so the upper ends of the thesis's ranges come from the pairs not run here "
                   "(below)." if big[1] < max(f["tp_all"]) else ".")]
    return lines + tail + ["", "Per highlighted pair (B = 1):", ""] + md_table(
        ["H / TP", "SL"] + [f"{s}x" for s in _scales()], per)


def dp_tables(rows: list[Row]) -> list[str]:
    f = figures()
    body = []
    for s in _scales():
        lo, hi = f["dp_share_slb4k"][s]
        at = _at(rows, s)
        mine = [r["dp_over_bwd"] for r in at if r["seq_len"] * r["batch"] == 4096]
        body.append([f"{s}x", f"{pct(lo, 0)}-{pct(hi, 0)}", _span(mine), _verdict(mine, lo, hi),
                     _span([r["dp_over_bwd"] for r in at])])
    slo, shi = f["dp_share_sweep"]
    sweep1 = [r["dp_over_bwd"] for r in _at(rows, "1")]
    return md_table(["compute scale", "thesis (SL x B = 4K)", "ours (SL x B = 4K)",
                     "points inside", "ours, whole sweep"], body) + [
        "", f"Whole sweep at 1x: thesis {pct(slo, 0)}-{pct(shi, 0)}, ours {_span(sweep1)} "
        f"({_verdict(sweep1, slo, shi)})."]


def trend_lines(tp_rows: list[Row], dp_rows: list[Row]) -> list[str]:
    checks: list[tuple[str, tuple[int, int]]] = [
        ("TP share rises with TP (fixed H, SL, B, scale)", trend(tp_rows, "tp_share", "tp", True)),
        ("TP share falls with H (fixed TP, SL, B, scale)",
         trend(tp_rows, "tp_share", "hidden", False)),
        ("TP share falls with SL (fixed H, TP, B, scale)",
         trend(tp_rows, "tp_share", "seq_len", False))]
    if dp_rows:
        checks.append(("DP share falls with SL (fixed H, B, scale)",
                       trend(dp_rows, "dp_over_bwd", "seq_len", False)))
        checks.append(("DP share falls with H (fixed SL, B, scale)",
                       trend(dp_rows, "dp_over_bwd", "hidden", False)))
    return md_table(["thesis trend (5.2.5, 5.3.3.4-5)", "neighbouring pairs that follow it"],
                    [[c, f"{ok} of {n}"] for c, (ok, n) in checks])


def missing_lines(tp_rows: list[Row], tps: Iterable[int]) -> list[str]:
    f = figures()
    ran = set(tps)
    absent = [t for t in f["tp_all"] if t not in ran]
    if not absent:
        return []
    n_pts = len(f["seq_len"]) * len(f["batch"]) * len(f["compute_scales"])
    counts = ", ".join(f"TP = {t}: {sum((h // f['head_dim']) % t == 0 for h in f['hidden']) * n_pts}"
                       for t in absent)
    return [
        "## Missing points", "",
        f"Not run: TP = {', '.join(map(str, absent))} (Table 5.1 goes to {max(f['tp_all'])}). "
        f"Points missing per TP degree: {counts}. "
        f"`mpiemu report comp_vs_comm --tp {' '.join(str(t) for t in f['tp_all'])}` runs them "
        "(folded: one process per TP group).", ""]


def case_lines(tp_rows: list[Row], case_rows: list[Row]) -> list[str]:
    """Future-2 and the Fig. 5.13 case study beside our points at their settings."""
    f = figures()
    cs, h_max = f["case_study"], max(f["hidden"])
    fut = [r["tp_share"] for r in tp_rows if r["hidden"] == h_max and r["highlighted"]
           and r["compute_scale"] == 1.0]
    case = [r["tp_share"] for r in tp_rows if (r["hidden"], r["seq_len"], r["batch"], r["tp"])
            == (cs["hidden"], cs["seq_len"], cs["batch"], cs["tp"])
            and r["compute_scale"] == float(cs["scale"])]
    # 5.3.3.7: "9% [of time] is spent on overlapped communication", hidden under the layer
    dp = [r["dp_layer_s"] / (r["compute_s"] + r["tp_comm_s"]) for r in case_rows]
    rows = [[f"Future-2: serialized TP share at H = {_k(h_max)} (highlighted pair, 1x, every SL "
             "and B)", pct(f["tp_share_future2"], 0), _span(fut)],
            [f"Fig. 5.13: serialized TP share, H = {_k(cs['hidden'])}, SL = {_k(cs['seq_len'])}, "
             f"B = {cs['batch']}, TP = {cs['tp']}, {cs['scale']}x", pct(cs["tp_share"], 0),
             _span(case)],
            [f"Fig. 5.13: overlapped (DP) communication over the layer's time, same point "
             f"(TP = {cs['tp']} x DP = {f['dp_grid']['dp']}: the layer's gradient all-reduce, "
             "measured apart, over its forward and backward with their TP all-reduces)",
             pct(cs["dp_share"], 0), _span(dp)]]
    for row in rows[1:]:                   # one point each: one value, not a span
        lo, _, hi = row[2].partition("-")
        row[2] = lo if lo == hi and lo else row[2]
    return ["## Future-2 and the case study (5.3.3.4, 5.3.3.7)", "",
            *md_table(["figure", "thesis", "ours"], rows), ""]


def _dp_ends(rows: list[Row]) -> str:
    """Both ends of our 1x DP range at SL x B = 4K, from the messages' bus bandwidth and
    the GEMMs' rate: latency-bound small messages at small H, both at their peaks at large H."""
    at = [r for r in _at(rows, "1") if r["seq_len"] * r["batch"] == 4096]
    if not at:
        return ""
    net, _ = sweep_network()
    f = figures()
    small, big = min(at, key=lambda r: r["hidden"]), max(at, key=lambda r: r["hidden"])
    flops = 4 * 4 * big["hidden"] ** 2 / big["tp"] * big["seq_len"] * big["batch"]  # Eq. 5.7
    return (f"At SL x B = 4K our 1x DP shares run from {pct(big['dp_over_bwd'])} "
            f"(H = {_k(big['hidden'])}) to {pct(small['dp_over_bwd'])} "
            f"(H = {_k(small['hidden'])}). At large H both sides run at their peaks: the FC's "
            f"backward GEMMs at {flops / big['bwd_gemm_s'] / 1e12:.0f} TFLOPS and its "
            f"{fc_grad_bytes(big) / 2**20:.0f} MiB all-reduce at a bus bandwidth of "
            f"{dp_busbw(big) / 1e9:.0f} GB/s, so the share settles where the thesis's lower "
            f"bound ({pct(f['dp_share_slb4k']['1'][0], 0)}) is. At small H the message is "
            f"latency-bound: the FC gradient of H = {_k(small['hidden'])} "
            f"({fc_grad_bytes(small) / 2**20:.0f} MiB over {small['dp']} ranks) reaches "
            f"{dp_busbw(small) / 1e9:.0f} GB/s (network {net.name}: base latency "
            f"{net.base('ring', 'simple') * 1e6:.1f} us per call, "
            f"{net.intra.latency('simple') * net.hop_scale('simple') * 1e6:.1f} us per step: "
            f"NCCL's latencies x the calibrated {net.call_latency_scale:g} and "
            f"{net.hop_scale('simple'):g}), the thesis's "
            "5.3.3.5: small messages do not saturate the network. Our DP job runs at TP = "
            f"{f['dp_grid']['tp']} where Fig. 5.10 is at TP = 16, so each of our messages is "
            "the thesis's at twice the H (Eq. 5.8: 4H x H / TP); its H = 1K at TP = 16, a "
            "quarter of our smallest message, is further into the latency-bound regime. ")


def _dp_scaling(rows: list[Row]) -> str:
    """How our DP share at SL x B = 4K moves from 1x to the faster compute scales."""
    base = {(r["hidden"], r["seq_len"], r["batch"]): r["dp_over_bwd"] for r in _at(rows, "1")
            if r["seq_len"] * r["batch"] == 4096}
    if not base:
        return ""
    parts = []
    for s in _scales()[1:]:
        ratio = [r["dp_over_bwd"] / base[(r["hidden"], r["seq_len"], r["batch"])]
                 for r in _at(rows, s) if (r["hidden"], r["seq_len"], r["batch"]) in base]
        parts.append(f"{s}x {min(ratio):.2f}-{max(ratio):.2f} times")
    f = figures()
    lo1, hi1 = f["dp_share_slb4k"]["1"]
    own = ", ".join(f"{s}x {pct(lo1 * float(s), 0)}-{pct(hi1 * float(s), 0)} against the stated "
                    f"{pct(f['dp_share_slb4k'][s][0], 0)}-{pct(f['dp_share_slb4k'][s][1], 0)}"
                    for s in _scales()[1:])
    return ("Compute made faster shortens the backward GEMMs in proportion (our DP shares at "
            f"SL x B = 4K grow {', '.join(parts)} their 1x values), as the thesis's method "
            "does (5.3.3.6 divides compute time by the factor). That method applied to the "
            f"thesis's own 1x range gives {own}: its stated 2x lower bound is above what its "
            "1x lower bound becomes, so the 2x points of ours that sit near the 1x lower "
            "bound fall below it. ")


def _ring_note(rows: list[Row]) -> str:
    """The largest TP ring against the thesis's size-only all-reduce time (a four-GPU
    measurement scaled by array size, (N - 1) / N ~ 1, 5.3.3.2)."""
    at = [r for r in _at(rows, "1") if r["highlighted"] and r["batch"] == 1]
    if not at:
        return ""
    r = max(at, key=lambda r: (r["tp"], -r["seq_len"]))
    net, bidirectional = sweep_network()
    bus = net.intra.bw_bytes_per_s * (2 if bidirectional else 1)
    n = r["tp"]
    nbytes = r["seq_len"] * r["batch"] * r["hidden"] * 2        # one all-reduce, fp16 (Eq. 5.5)
    size_only = 4 * bus_factor("all_reduce", n) * nbytes / bus
    share = size_only / (r["compute_s"] + size_only)
    return (f"at H = {_k(r['hidden'])}, TP = {n}, SL = {_k(r['seq_len'])}, B = 1 our four "
            f"all-reduces per layer take {r['tp_comm_s'] / 4 * 1e3:.2f} ms each, where the "
            f"same bytes at the ring's peak bus bandwidth ({bus / 1e9:.0f} GB/s) take "
            f"{size_only / 4 * 1e3:.2f} ms; the rest is the 2(N - 1) = {2 * (n - 1)} steps of "
            f"a {n}-GPU ring. The thesis scales a four-GPU measurement by the array size "
            "((N - 1) / N ~ 1 for large N, 5.3.3.2), with no per-step term: with that "
            f"all-reduce time our share there would be {pct(share)} instead of "
            f"{pct(r['tp_share'])}, which is why our shares at the largest TP pass the "
            "thesis's upper bounds.")


def _tp_low(rows: list[Row]) -> str:
    """The highlighted points below the thesis's lower bounds: where they lie (H, SL) and
    how much of their compute is the attention core, whose work grows with SL^2."""
    f = figures()
    hi_rows = [r for r in rows if r["highlighted"]]
    below = {s: [r for r in _at(hi_rows, s) if r["tp_share"] < f["tp_share"][s][0]]
             for s in _scales()}
    low = [r for s in _scales() for r in below[s]]
    if not low:
        return ""
    named = f["named_min_hidden"]
    small = [r for r in low if r["hidden"] < named]
    other = [r for r in low if r["hidden"] >= named]
    worst = max(low, key=lambda r: r["attn_core_s"] / r["compute_s"])

    def edge(r: Row) -> float:
        return (r["hidden"] + r["seq_len"]) / r["tp"]

    counts = ", ".join(f"{s}x {len(below[s])}" for s in _scales())
    named_edge = max((edge(r) for r in hi_rows if r["hidden"] >= named), default=0.0)
    text = (f"The highlighted points below the thesis's lower bounds ({counts}) are "
            f"{len(small)} at H <= {_k(named // 2)}, the H / TP = {f['highlighted_h_per_tp']} "
            f"diagonal continued below the smallest model the thesis names (~T-NLG, "
            f"H = {_k(named)}), with SL from {_k(min(r['seq_len'] for r in small))} up"
            if small else "The highlighted points below the thesis's lower bounds "
            f"({counts})")
    if other:
        text += (" and " if small else " are ") + "; ".join(
            f"H = {_k(r['hidden'])}, SL = {_k(r['seq_len'])}, B = {r['batch']} at "
            f"{r['compute_scale']:g}x ({pct(r['tp_share'], 2)} against "
            f"{pct(f['tp_share'][str(int(r['compute_scale']))][0], 0)})" for r in other)
    against = (f", against at most {named_edge / 1024:.2f}K from H = {_k(named)} up"
               if named_edge else "")
    return (text + ". There compute's edge of Eq. 5.6, (H + SL) / TP, is the largest of the "
            f"highlighted points (up to {max(edge(r) for r in low) / 1024:.2f}K{against}), "
            "and the attention "
            "core, the score and context BGEMMs with the scale / mask / softmax / dropout "
            "kernels on the SL x SL score matrix (work in SL^2, Eq. 5.2), takes up to "
            f"{pct(worst['attn_core_s'] / worst['compute_s'], 0)} of the layer's compute "
            f"(H = {_k(worst['hidden'])}, SL = {_k(worst['seq_len'])}, B = {worst['batch']}, "
            f"{worst['compute_scale']:g}x), while the four all-reduces grow with SL only. ")


def markdown(tp_rows: list[Row], dp_rows: list[Row], case_rows: list[Row],
             tps: Iterable[int]) -> list[str]:
    f = figures()
    g = f["dp_grid"]
    net = ", ".join(f"`{x}`" for x in f["network"])
    return [
        "# Computation vs communication as Transformers and GPUs scale (thesis seed 003, "
        "chapter 5)", "",
        "Generated by `mpiemu report comp_vs_comm`. Every point is an emulated run of one "
        "transformer layer, forward and backward, on real MPI ranks of the timing-only "
        "engine (`layer_sweep` kind, `workloads/comp_vs_comm.toml`): H, SL, B of Table 5.1, "
        f"FC width 4H, heads of {f['head_dim']}, on the `{f['device']}` preset, the compute "
        f"of each point made {', '.join(f'{s}x' for s in f['compute_scales'])} faster with "
        "`device.scale.compute` (matrix, vector "
        "and SFU peaks, clock, L2 feed; DRAM and network unchanged, 5.3.3.6). Network "
        f"assumption: {net} (`comp_vs_comm.toml` gives its source) on the device's network "
        "preset, which charges each collective RCCL's (NCCL's) base latency per call and "
        "hop latency per step (`mpiemu devices --network mi210-node`): the serialized TP "
        "shares of the small layers carry those fixed costs. The thesis's figures are in "
        "`mpiemu/studies/comp_vs_comm.toml`.",
        "",
        f"TP jobs: one per TP in {sorted(set(tps))}, each folded onto one process (`run.fold`: "
        "the TP group's ranks are symmetric, so one stands for all, bit-identical; "
        "`tests/test_fold.py`) (`tp.csv`); serialized TP "
        "share = TP all-reduce time not under compute over the layer's time. DP job: "
        f"TP = {g['tp']} x DP = {g['dp']} (`dp.csv`); DP share = the thesis's region of "
        "interest (5.3.2.2 step 2.a, Eq. 5.7, 5.8): the FC weight's gradient all-reduced "
        "over DP, measured apart, over that FC's weight-gradient and error GEMMs.", "",
        "## Serialized TP communication (Figs. 5.9, 5.12)", "",
        *tp_tables(tp_rows), "",
        "![tp share](tp_share.png)", "",
        "## DP communication against the backward compute that hides it (Figs. 5.10, 5.11)",
        "",
        *(dp_tables(dp_rows) if dp_rows else ["(DP job skipped: --no-dp)"]), "",
        *(["![dp share](dp_share.png)", ""] if dp_rows else []),
        "## Trends", "", *trend_lines(tp_rows, dp_rows), "",
        *case_lines(tp_rows, case_rows), *missing_lines(tp_rows, tps),
        "## Where we differ and why", "",
        *(["* **DP shares.** " + _dp_ends(dp_rows) + _dp_scaling(dp_rows), ""] if dp_rows
          else []),
        "* **Highest TP shares.** Our TP all-reduces (H x SL x B elements, tens of MiB and "
        "more) reach the ring's bandwidth, but each pays a hop latency per step: "
        + _ring_note(tp_rows), "",
        "* **Lowest TP shares.** " + _tp_low(tp_rows), "",
        "* **Compute.** Our compute is the kernel model of `devices/` at the preset's GEMM "
        "efficiency, where the thesis projects measured BERT operators whose GEMMs run "
        "below peak (5.3.3.8), which makes its compute longer and its TP share lower at a "
        "given point.",
    ]


def _panel(rows: list[Row], path: Path, x: Callable[[Row], float], y: str, band: Any,
           xlabel: str, ylabel: str, title: str, band_label: str = "thesis range") -> None:
    pyplot = plt()
    fig, axes = pyplot.subplots(1, 3, figsize=(13, 4), sharey=True)
    hs = sorted({r["hidden"] for r in rows})
    cmap = pyplot.get_cmap("viridis")
    for ax, s in zip(axes, _scales()):
        lo, hi = band(s)
        ax.axhspan(lo, hi, color="tab:red", alpha=0.12, label=band_label)
        for i, h in enumerate(hs):
            pts = sorted((r for r in _at(rows, s) if r["hidden"] == h), key=x)
            ax.plot([x(r) for r in pts], [r[y] for r in pts], "o", ms=3,
                    color=cmap(i / max(1, len(hs) - 1)), label=f"H = {_k(h)}")
        ax.set_xscale("log", base=2)
        ax.set_title(f"{title}, compute {s}x", fontsize=9)
        ax.set_xlabel(xlabel)
    axes[0].set_ylabel(ylabel)
    axes[-1].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot.close(fig)


def plot_tp(rows: list[Row], path: Path) -> None:
    f = figures()
    _panel(rows, path, lambda r: r["tp"], "tp_share", lambda s: f["tp_share"][s], "TP degree",
           "serialized TP communication / layer time", "every SL, B")


def plot_dp(rows: list[Row], path: Path) -> None:
    f = figures()
    _panel(rows, path, lambda r: r["seq_len"] * r["batch"], "dp_over_bwd",
           lambda s: f["dp_share_slb4k"][s], "SL x B (tokens)",
           "FC gradient all-reduce / FC backward GEMMs", f"TP = {f['dp_grid']['tp']}",
           "thesis range at SL x B = 4K")


def main(out_dir: Path, argv: list[str]) -> int:
    f = figures()
    ap = argparse.ArgumentParser(prog="mpiemu report comp_vs_comm",
                                 description=comp_vs_comm.__doc__)
    ap.add_argument("--tp", type=int, nargs="+", default=list(f["tp_run"]),
                    help=f"TP degrees to run (Table 5.1: {f['tp_all']})")
    ap.add_argument("--no-dp", action="store_true", help="skip the TP x DP job")
    ap.add_argument("--set", action="append", default=[], help="extra workload overrides")
    ap.add_argument("--keep-runs", type=Path, help="keep the run directories here")
    ap.add_argument("--out", type=Path, help="output directory (as `mpiemu report --out`)")
    args = ap.parse_args([a for a in argv if a != "--"])
    out_dir = out_dir_of(args, out_dir)
    with runs_dir(args, "mpiemu-cvc-") as runs:
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
    plot_tp(tp_rows, out_dir / "tp_share.png")
    if dp_rows:
        plot_dp(dp_rows, out_dir / "dp_share.png")
    (out_dir / "README.md").write_text(
        "\n".join(markdown(tp_rows, dp_rows, case_rows, args.tp)) + "\n")
    print(f"wrote {out_dir}/README.md and CSV/PNG beside it")
    return 0

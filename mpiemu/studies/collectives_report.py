"""`main`, Markdown and plot of `mpiemu report collectives` (`collectives.py` runs the sweeps;
every number generated from the rows)."""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from ..devices.cost import device_cost
from ..devices.presets import load_device
from ..net import load_network
from ..runner.collective_sweep import bus_factor
from . import collectives
from .collectives_all_to_all import headline, section, write_doc_headline
from .collectives import (ITEMSIZE, MiB, calibrate, calibrated, compare, fit, read_calibration,
                          setups, sources, summarize, sweep, targets_error)
from .common import ROOT, Row, load_figures, md_table, pct, plt, signed_pct, write_csv


def _size(b: int) -> str:
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << k:
            return f"{b / (1 << k):g} {unit}"
    return f"{b} B"


def _setup_table() -> list[str]:
    rows = []
    for st in setups():
        net = load_network(load_device(st["device"]).network)
        g = net.devices_per_node or st["ranks"]
        rows.append([st["name"], f"`{st['key']}`", st["device"], net.name,
                     st["ranks"], max(1, st["ranks"] // g),
                     " ".join(f"`{s}`" for s in st["sets"]) or "-"])
    return md_table(["setup", "key", "device", "network", "GPUs", "nodes", "overrides"], rows,
                    "lllllrrl")


def _summary_table(summ: list[Row], fitted: set[str]) -> list[str]:
    src = sources()
    lo, hi = (float(x) for x in load_figures("collectives")["targets"].value)
    rows = []
    for s in summ:
        d = src[s["dataset"]]
        big = s["geomean_abs_error_1MiB_up"]
        rows.append([f"[{s['dataset']}]({d['url']})", d["system"], s["points"],
                     pct(big) if big is not None else "-", pct(s["geomean_abs_error_all"]),
                     signed_pct(s["mean_signed_error"]),
                     "yes" if (big is None or big <= lo) and s["geomean_abs_error_all"] <= hi
                     else "no", "fitted on" if s["dataset"] in fitted else "held out"])
    return md_table(["measured data set", "system", "sizes", "geomean abs err >= 1 MiB",
                     "geomean abs err, all", "mean signed err", "within targets",
                     "calibration"], rows, "llrrrrll")


def _per_size(cmp: list[Row], ds: str) -> list[str]:
    mine = [r for r in cmp if r["dataset"] == ds]
    ops = len({r["op"] for r in mine}) > 1       # a data set of several collectives
    rows = [[_size(r["bytes"]) + (f", {r['op']}" if ops else ""),
             f"{r['algorithm']}/{r['protocol']}", f"{r['ours_busbw_GBps']:.2f}",
             f"{r['measured_busbw_GBps']:.2f}", signed_pct(r["error"])] for r in mine]
    return md_table(["size" + (", collective" if ops else ""), "ours: algorithm/protocol",
                     "ours busbw GB/s", "measured busbw GB/s", "error"], rows)


def _worst(cmp: list[Row], ds: str) -> str:
    rows = [r for r in cmp if r["dataset"] == ds]
    w = max(rows, key=lambda r: abs(r["error"]))
    return (f"largest difference at {_size(w['bytes'])}: ours {w['ours_busbw_GBps']:.2f} vs "
            f"measured {w['measured_busbw_GBps']:.2f} GB/s ({signed_pct(w['error'])}, "
            f"{w['algorithm']}/{w['protocol']})")


def _emulated_only(ours: list[Row]) -> list[str]:
    keys = [s["key"] for s in setups() if not s["datasets"]]
    sizes = sorted({r["bytes"] for r in ours if r["setup"] in keys})
    pick = [s for s in sizes if s in (MiB, 64 * MiB, 1 << 30, 4 << 30)] or sizes[-3:]
    rows = []
    for k in keys:
        for b in pick:
            r = next((x for x in ours if x["setup"] == k and x["bytes"] == b), None)
            if r is not None:
                rows.append([k, r["ranks"], _size(b), f"{r['algorithm']}/{r['protocol']}",
                             f"{r['time_us']:.1f}", f"{r['busbw_GBps']:.2f}"])
    return md_table(["setup", "GPUs", "size", "algorithm/protocol", "time us", "busbw GB/s"],
                    rows, "lrrlrr")


WHY = [
    "* **Latency (small and mid sizes).** Our floor is NCCL's own latency model (baseLat + "
    "2(N-1) hop latencies, `docs/nccl_model.md`), the call's base times "
    "`network.call_latency_scale` and each hop's latency times its protocol's "
    "`network.hop_latency_scale`: "
    "tuning.cc keeps its latencies as relative costs for choosing an algorithm, and "
    "measured calls take longer, by the same factors on A100 and H100, ring and NVLS, from "
    "1 KiB to hundreds of MiB. These factors are the calibrated constants here (values "
    "above); a data set whose floor is further off (virtualised cloud VMs, older NCCL, "
    "in-place timing) still shows as an error at small sizes: the model has no per-cloud "
    "term, by design.",
    "* **Mid sizes (1-64 MiB).** A call too small to fill NCCL's channels runs fewer of them "
    "(`enqueue.cc` getChannnelThreadInfo), and ours does too (`NetworkSpec.channel_share`); "
    "past that our calls move at the protocol's full rate plus the scaled latencies. NCCL "
    "also pipelines each channel's share in chunks whose steps it cannot all overlap, which "
    "we do not model; the measured curves ramp more slowly than latency + size / rate (the "
    "A100 ring's LL128 and Simple sizes, where ours is fast), and the one call scale sets "
    "NVLS's base latency (NCCL's, times the scale) above what the smallest NVLS calls "
    "measure (ours slow there; per-size tables below).",
    "* **Large messages (bandwidth-bound).** The ring moves at NCCL's counted link rate "
    "(20 GB/s per NVLink3 x 12 on A100; the 12 x 30 GB/s ring graph on H100) and NVLS at the "
    "port rate x 5/6 over S (N+1)/N; measured runs sit a few percent below or above that.",
    "* **Across nodes.** One lane per rail (NCCL's channels) crosses each node boundary on "
    "its own NIC, the ring's and the tree's; RoCE / EFA / TCPXO fabrics are described by "
    "their NIC rate and NCCL's network latencies only, which is why the EFA and TCPXO sets "
    "stay far off. Each call runs what NCCL's own model picks (`comm/tuner.py`): on two nodes "
    "it counts ring and tree at the NVLink rate (tuning.cc:174), so it keeps the ring for "
    "large all-reduces where NVLS is off or absent (A100), and takes NVLS Tree across H100 "
    "nodes (the switch reduces inside each node, a tree on every rail joins them). The "
    "hierarchical all-reduce is not NCCL's and is never chosen (it "
    "runs only when asked).",
]


def _tuner_plugin(ours: list[Row], cmp: list[Row]) -> list[str]:
    """Where a setup forces an algorithm to show what a vendor's tuner plugin may run
    (`what_if`: the data set it stands beside): ours forced, ours by NCCL's model, measured."""
    out = []
    for st in setups():
        ds = st.get("what_if")
        if not ds:
            continue
        meas = {r["bytes"]: r for r in cmp if r["dataset"] == ds}
        forced = [r for r in ours if r["setup"] == st["key"] and r["bytes"] in meas]
        if not forced:
            continue
        parts = [f"{_size(r['bytes'])} {r['busbw_GBps']:.2f} against "
                 f"{m['measured_busbw_GBps']:.2f} "
                 f"({signed_pct(r['busbw_GBps'] / m['measured_busbw_GBps'] - 1)}"
                 f"; NCCL's model's {m['algorithm']}: {signed_pct(m['error'])})"
                 for r in forced for m in (meas[r["bytes"]],)]
        out.append(f"{ds} runs GCP's tuner plugin (NCCL_TUNER_PLUGIN in the A3 Mega "
                   "environment, collectives_sources.toml), whose rules are not public, and its "
                   "large all-reduces move more than a ring can carry through the nodes' NICs; "
                   f"with the {forced[0]['algorithm']} forced (setup `{st['key']}`), ours: "
                   + ", ".join(parts))
    if not out:
        return []
    return ["* **Tuner plugins.** " + "; ".join(out) + "."]


def _tree_floor(ours: list[Row], cmp: list[Row]) -> list[str]:
    """Where a multi-node data set's smallest size runs our tree: its latency parts, from
    the setup's network, beside the measured time (nccl-tests: t = S x bus factor / busbw)."""
    out = []
    for st in setups():
        rows = [r for r in cmp if r["setup"] == st["key"] and r["algorithm"] == "tree"]
        if st["ranks"] <= 8 or not rows:
            continue
        net = load_network(load_device(st["device"]).network)
        if net.inter is None:
            continue
        r = min(rows, key=lambda r: r["bytes"])
        mine = next(x for x in ours if (x["setup"], x["op"], x["bytes"]) ==
                    (r["setup"], r["op"], r["bytes"]))
        g, n, p = net.devices_per_node, st["ranks"], r["protocol"]
        kc, kh = net.call_latency_scale, net.hop_scale(p)
        a_nv, a_net = net.intra.latency(p, "tree"), net.inter.latency(p, "tree")
        base, net_hops = net.nccl_base("tree", p), math.ceil(math.log2(n // g))
        hops = 2 * ((g - 1) * a_nv + net_hops * a_net)
        lat = net.base("tree", p) + hops * kh
        measured = r["bytes"] * bus_factor(r["op"], n) / (r["measured_busbw_GBps"] * 1e9)
        share = net.channel_share(p, r["bytes"], n)
        out.append(f"{r['dataset']} at {_size(r['bytes'])}: ours {mine['time_us']:.1f} us "
                   f"(tree/{p}), of which {lat * 1e6:.1f} us are latencies (NCCL's base "
                   f"{base * 1e6:.1f} us x {kc:g} and, up and down, {g - 1} NVLink "
                   f"hops of {a_nv * 1e6:.2f} us and {net_hops} network hop of "
                   f"{a_net * 1e6:.2f} us, each x {kh:g}) and "
                   f"{mine['time_us'] - lat * 1e6:.1f} us the trees' parts' wire "
                   f"time at 1/{1 / share:.0f} of each port (the channels and threads NCCL "
                   "gives a call this small, enqueue.cc) and the trees meeting at shared "
                   f"ports; measured {measured * 1e6:.1f} us; "
                   f"NCCL's latencies unscaled sum to {(base + hops) * 1e6:.1f} us")
    if not out:
        return []
    return ["* **Small messages across nodes.** The latency scales were fitted on "
            "single-node data, where only the base and NVLink hop latencies act; the network "
            "hops take the hop scale too, which no data set of the fit tests: "
            + "; ".join(out) + "."]


def _rs_vs_ag(ours: list[Row], cmp: list[Row]) -> list[str]:
    """Where a data set measures reduce-scatter and all-gather at one size: our ring's gap
    between the two is its exposed last reduction (`comm.cost.ring_steps_s`)."""
    out = []
    for ds in sorted({r["dataset"] for r in cmp}):
        at = {r["op"]: r for r in cmp if r["dataset"] == ds}
        if not {"reduce_scatter", "all_gather"} <= set(at):
            continue
        rs, ag = at["reduce_scatter"], at["all_gather"]
        if rs["bytes"] != ag["bytes"]:
            continue
        t = {x["op"]: x["time_us"] for x in ours if x["setup"] == rs["setup"]
             and x["bytes"] == rs["bytes"]}
        gap_ms = (t["reduce_scatter"] - t["all_gather"]) / 1e3
        st = next(x for x in setups() if x["key"] == rs["setup"])
        chunk = rs["bytes"] // st["ranks"]
        red_ms = device_cost(load_device(st["device"])).reduction_s(
            chunk // ITEMSIZE, ITEMSIZE) * 1e3
        out.append(f"{ds} at {_size(rs['bytes'])}: our reduce-scatter takes "
                   f"{t['reduce_scatter'] / 1e3:.2f} ms and our all-gather "
                   f"{t['all_gather'] / 1e3:.2f} ms; the {gap_ms:.2f} ms between them is the "
                   f"ring's last step reducing a whole {_size(chunk)} chunk (S / N, fp32: "
                   f"{red_ms:.2f} ms at the device's streaming bandwidth) after it arrives, "
                   "where NCCL reduces slice by slice as data "
                   f"streams in: measured, its two run alike ({rs['measured_busbw_GBps']:.1f} "
                   f"and {ag['measured_busbw_GBps']:.1f} GB/s)")
    if not out:
        return []
    return ["* **Reduce-scatter at large sizes.** " + "; ".join(out) + "."]


def _calibration_text(cal: list[Row] | None, fitted: list[str]) -> str:
    """The calibrated latency scales, the data they were fitted on, and what the grid
    (`calibration.csv`, written by `--calibrate`) says of the form: the fit beside the best
    point with one factor on every latency and the best with NCCL's hop latencies as they
    are."""
    net = load_network("dgx-a100")
    hops = ", ".join(f"{p} {net.hop_scale(p):g}" for p in net.protocols)
    text = (f"The calibrated constants, fitted together: `network.call_latency_scale` = "
            f"{net.call_latency_scale:g} (each call's base latency, NCCL's baseLat) and "
            f"`network.hop_latency_scale` per protocol ({hops}; each hop's, hwLat), on the "
            f"single-node data sets ({', '.join(fitted)}; `mpiemu report collectives "
            "--calibrate` reruns the grid, its objective in "
            "`mpiemu/studies/collectives.toml`).")
    if not cal:
        return text
    best = fit(cal)
    alike = fit([r for r in cal if r["call"] == r["hop_ll"] == r["hop_ll128"] ==
                 r["hop_simple"]] or cal)
    ncll = fit([r for r in cal if r["hop_ll"] == r["hop_ll128"] == r["hop_simple"] == 1]
               or cal)

    def point(r: Row, what: str) -> str:
        return (f"{what} gives {pct(r['error_1MiB_up'])} from 1 MiB up and "
                f"{pct(r['error_all'])} over all sizes")
    return (text + " On those sets " + "; ".join([
        point(best, "the fit"),
        point(alike, f"the best with one factor on every latency ({alike['call']:g})"),
        point(ncll, f"the best with NCCL's hop latencies as they are (call "
                    f"{ncll['call']:g})")]) + f" ({len(cal)} grid points, calibration.csv).")


def markdown(ours: list[Row], cmp: list[Row], summ: list[Row],
             cal: list[Row] | None = None) -> list[str]:
    fig = load_figures("collectives")
    lo, hi = (float(x) for x in fig["targets"].value)
    big = [r for r in cmp if r["bytes"] >= MiB]
    if not cmp:
        return ["# Collectives (emulated only: no measured data set in this selection)", "",
                *_emulated_only(ours)]
    g_big, g_all = targets_error(cmp)
    fitted = calibrated(cmp)
    held = [r for r in cmp if r["dataset"] not in fitted]
    h_big, h_all = targets_error(held)
    multi_keys = {s["key"] for s in setups() if s["ranks"] > 8}
    m_big, m_all = targets_error([r for r in held if r["setup"] in multi_keys])
    s_big, s_all = targets_error([r for r in held if r["setup"] not in multi_keys])
    out = ["# Collectives on DGX-class machines: emulated vs published nccl-tests", "",
           "Regenerate: `mpiemu report collectives` (or `make reports`); sources of every "
           "measured row: `mpiemu/studies/collectives_sources.toml`; network numbers: "
           "`mpiemu devices --network`. busbw as nccl-tests defines it "
           f"({fig['busbw'].value}).", "",
           f"**Held out** (the data sets no constant was fitted on: "
           f"{', '.join(sorted({r['dataset'] for r in held}))}): geometric mean of |busbw "
           f"error| {pct(h_big)} from 1 MiB up ({sum(r['bytes'] >= MiB for r in held)} "
           f"points; target {pct(lo, 0)}) and {pct(h_all)} over all sizes ({len(held)} "
           f"points; target {pct(hi, 0)}); on the held-out single-node ones alone, "
           f"{pct(s_big)} and {pct(s_all)}; on the multi-node ones alone, {pct(m_big)} and "
           f"{pct(m_all)}. {_calibration_text(cal, sorted(fitted))} Every measured point "
           f"pooled, fitted and held out: {pct(g_big)} from 1 MiB up ({len(big)} points) and "
           f"{pct(g_all)} over all sizes ({len(cmp)} points). Nothing is fitted per size or "
           "per data set.", "", "## Setups", "", *_setup_table(), "",
           "## Ours against each measured data set", "", *_summary_table(summ, fitted), "",
           "## Where we differ, and why", "", *WHY, *_tuner_plugin(ours, cmp),
           *_tree_floor(ours, cmp),
           *_rs_vs_ag(ours, cmp), ""]
    for s in summ:
        out += [f"### {s['dataset']}", "", _worst(cmp, s["dataset"]) + ".", "",
                *_per_size(cmp, s["dataset"]), ""]
    out += [*section(ours, cmp, setups()),
            "## Emulated only: 4 to 16 nodes, all-to-all across 2 nodes, and a forced "
            "algorithm", "",
            *_emulated_only(ours), "",
            "![busbw](busbw.png)", ""]
    return out


def plot(ours: list[Row], cmp: list[Row], path: Path) -> None:
    """One panel per measured setup, in a grid of at most 4 columns: ours as lines, the
    measured points as dots, sizes in KB / MB / GB, each legend below its panel."""
    pyplot = plt()
    keys = {r["setup"] for r in ours}
    sts = [s for s in setups() if s["datasets"] and s["key"] in keys]
    if not sts:
        return
    cols = min(4, len(sts))
    nrows = -(-len(sts) // cols)
    fig, grid = pyplot.subplots(nrows, cols, figsize=(4.2 * cols, 4.4 * nrows),
                                squeeze=False)
    for ax, st in zip(grid.flat, sts):
        for op in st["ops"]:
            rows = [r for r in ours if r["setup"] == st["key"] and r["op"] == op]
            ax.plot([r["bytes"] for r in rows], [r["busbw_GBps"] for r in rows],
                    "-" if len(rows) > 1 else "x", label=f"ours {op}")
        for ds in st["datasets"]:
            pts = [r for r in cmp if r["dataset"] == ds]
            ax.plot([r["bytes"] for r in pts], [r["measured_busbw_GBps"] for r in pts], "o",
                    ms=3, label=ds[:32])
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(pyplot.FuncFormatter(lambda b, _: _size(int(b))))
        ax.tick_params(axis="x", labelsize=7, labelrotation=45)
        ax.set_title(st["key"], fontsize=9)
        ax.set_ylabel("busbw GB/s", fontsize=8)
        ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=1,
                  frameon=False)
    for ax in list(grid.flat)[len(sts):]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot.close(fig)


def _args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="mpiemu report collectives",
                                 description=collectives.__doc__)
    ap.add_argument("--only", nargs="*", help="setup keys to run (default: all)")
    ap.add_argument("--out", help="output directory (default results/collectives)")
    ap.add_argument("--calibrate", action="store_true",
                    help="fit network.call_latency_scale and hop_latency_scale.* on the "
                         "calibration data sets (a grid); prints the table and writes "
                         "calibration.csv (which the report reads), nothing else")
    return ap.parse_args(argv)


def _scales(r: Row) -> str:
    return (f"call_latency_scale {r['call']:g}, hop_latency_scale ll {r['hop_ll']:g} / "
            f"ll128 {r['hop_ll128']:g} / simple {r['hop_simple']:g}")


def main(out_dir: Path, argv: list[str]) -> int:
    """Run the setups, compare, write the report; returns a process exit code."""
    args = _args(argv)
    out_dir = Path(args.out) if args.out else out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.calibrate:
        table = calibrate()
        write_csv(out_dir / "calibration.csv", table)
        for r in table:
            sys.stdout.write(f"{_scales(r)}: {r['error_1MiB_up']:.1%} from 1 MiB up, "
                             f"{r['error_all']:.1%} over all sizes\n")
        sys.stdout.write(f"fit: {_scales(fit(table))}; wrote {out_dir}/calibration.csv\n")
        return 0
    ours = sweep(args.only)
    cmp = compare(ours, setups())
    summ = summarize(cmp)
    for name, rows in (("emulated", ours), ("comparison", cmp), ("summary", summ)):
        if rows:
            write_csv(out_dir / f"{name}.csv", rows)
    plot(ours, cmp, out_dir / "busbw.png")
    cal = read_calibration(out_dir / "calibration.csv")
    (out_dir / "README.md").write_text("\n".join(markdown(ours, cmp, summ, cal)) + "\n")
    if not args.only and out_dir.resolve() == (ROOT / "results" / "collectives").resolve():
        write_doc_headline(headline(cmp, setups()))      # docs/network.md quotes the report
    sys.stdout.write(f"wrote {out_dir}/README.md, emulated.csv, comparison.csv, summary.csv, "
                     "busbw.png\n")
    return 0

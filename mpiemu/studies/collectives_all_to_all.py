"""The all-to-all part of `mpiemu report collectives`: our all-to-all (`comm.all_to_all`,
NCCL's sends and receives) beside the published alltoall_perf rows, its headline (also
written into docs/network.md between markers, so the docs quote the report), and the emulated
rows no measurement covers. Every number comes from the rows."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from .collectives import sources
from .common import ROOT, Row, md_table, signed_pct

OP = "all_to_all"
DOC = ROOT / "docs" / "network.md"
BEGIN = "<!-- all-to-all headline: written by `mpiemu report collectives`, do not edit -->"
END = "<!-- end of the all-to-all headline -->"


def _size(b: int) -> str:
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << k and b % (1 << k) == 0:
            return f"{b >> k} {unit}"
    return f"{b} B"


def measured_rows(cmp: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The comparison rows of all-to-all (`collectives.compare`)."""
    return [r for r in cmp if r["op"] == OP]


def headline(cmp: Sequence[Mapping[str, Any]], setups: Sequence[Mapping[str, Any]]) -> str:
    """One sentence: every measured all-to-all point, ours beside it (busbw, nccl-tests')."""
    rows = measured_rows(cmp)
    if not rows:
        return "No published all-to-all measurement is in this selection."
    ranks = {s["key"]: s["ranks"] for s in setups}
    parts = [f"{ranks[r['setup']]} GPUs at {_size(int(r['bytes']))} ({r['dataset']}): ours "
             f"{float(r['ours_busbw_GBps']):.1f} against {float(r['measured_busbw_GBps']):.1f} "
             f"GB/s busbw ({signed_pct(float(r['error']))})" for r in rows]
    return ("All-to-all against published nccl-tests alltoall_perf rows on H100 (held out: "
            "no constant fitted on them): " + "; ".join(parts) + ".")


def section(ours: list[Row], cmp: list[Row], setups: list[dict[str, Any]]) -> list[str]:
    """The README's all-to-all section: the headline, each measured row beside ours, and our
    rows at large sizes where no measurement was found."""
    mine = [r for r in ours if r["op"] == OP]
    if not mine:
        return []
    by = {s["key"]: s for s in setups}
    rows = [[r["setup"], by[r["setup"]]["ranks"], _size(r["bytes"]),
             f"{r['ours_busbw_GBps']:.2f}", f"{r['measured_busbw_GBps']:.2f}",
             signed_pct(r["error"]), f"[{r['dataset']}]({src_url(r['dataset'])})"]
            for r in measured_rows(cmp)]
    big = [r for r in mine if r["bytes"] >= 1 << 30 and by[r["setup"]]["datasets"]
           and not any(m["setup"] == r["setup"] for m in measured_rows(cmp))]
    emu = [[r["setup"], r["ranks"], _size(r["bytes"]), f"{r['time_us']:.1f}",
            f"{r['busbw_GBps']:.2f}"] for r in big]
    return ["## All-to-all", "",
            "NCCL's alltoall is a send and a receive to every peer (`comm/all_to_all.py`): "
            "each message crosses the sender's port and the receiver's, so the call takes "
            "the busiest port's bytes at the Simple rate (`comm.cost.all_to_all_s`). "
            + headline(cmp, setups), "",
            *md_table(["setup", "GPUs", "size", "ours busbw GB/s", "measured busbw GB/s",
                       "error", "source"], rows, "lrrrrrl"), "",
            "Emulated only (no published alltoall_perf row on these machines was found; "
            "across 2 nodes: the emulated-only table below): on one node the port's rate "
            "bounds busbw; across nodes the NICs, each carrying a GPU's traffic to the other "
            "nodes.", "",
            *md_table(["setup", "GPUs", "size", "time us", "busbw GB/s"], emu, "lrrrr"), ""]


def src_url(dataset: str) -> str:
    return str(sources()[dataset]["url"])


def write_doc_headline(text: str, doc: Path = DOC) -> bool:
    """Put `text` between the markers of docs/network.md; False if the markers are absent."""
    old = doc.read_text()
    if BEGIN not in old or END not in old:
        return False
    head, rest = old.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    doc.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")
    return True


def doc_headline(doc: Path = DOC) -> str:
    """What docs/network.md holds between the markers."""
    text = doc.read_text()
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip()

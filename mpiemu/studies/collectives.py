"""`mpiemu report collectives`: NCCL collectives on DGX-class machines, emulated beside
published nccl-tests measurements.

Each setup of `collectives.toml` is one emulated job (`mpiexec -n N mpiemu run
workloads/collectives.toml`, timing only) sweeping all-reduce / all-gather / reduce-scatter
from 1 KiB to 4 GiB on a network preset; its algbw and busbw (nccl-tests' definitions) are
compared size by size with the measured rows of `collectives_measured.csv` (sources in
`collectives_sources.toml`). Nothing is fitted: every network number is a preset's, sourced
to NCCL's own model or vendor documentation. The golden test reruns the 8-GPU DGX H100 setup.
"""
from __future__ import annotations

import itertools
import math
import tempfile
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

from ..net.spec import PROTOCOLS
from ..config.schema import parse_size
from .common import Golden, Row, geomean, load_figures, read_csv
from .runs import run

MiB = 1 << 20
DTYPE, ITEMSIZE = "fp32", 4     # the emulated element every sweep moves (nccl-tests -d float)


def setups() -> list[dict[str, Any]]:
    return list(load_figures("collectives")["setups"].value)


def sizes(every: int = 1) -> list[int]:
    """1 KiB .. 4 GiB in steps of 2x (every n-th kept)."""
    lo, hi = (parse_size("sizes", s) for s in load_figures("collectives")["sizes"].value)
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= 2
    return out[::every]


def measured() -> list[dict[str, str]]:
    """The published rows, as copied (collectives_measured.csv)."""
    text = (resources.files("mpiemu.studies") / "collectives_measured.csv").read_text()
    import csv  # noqa: PLC0415
    import io  # noqa: PLC0415
    return list(csv.DictReader(io.StringIO(text)))


def sources() -> dict[str, dict[str, Any]]:
    text = (resources.files("mpiemu.studies") / "collectives_sources.toml").read_text()
    return dict(tomllib.loads(text)["datasets"])


def emulate(setup: dict[str, Any], tmp: Path) -> list[Row]:
    """One setup's sweep, run as a user would; its rows (time in us, GB/s)."""
    size_list = ([parse_size("sizes", x) for x in setup["sizes"]] if "sizes" in setup
                 else sizes(int(setup.get("every", 1))))
    sets = [f"device.preset={setup['device']!r}", f"parallel.tp={setup['ranks']}",
            "run.numerics=off", f"run.emulated_dtype={DTYPE}",
            f"collectives.ops={list(setup['ops'])!r}", f"collectives.sizes={size_list!r}",
            *setup["sets"]]
    out = tmp / setup["key"]
    run(int(setup["ranks"]), "workloads/collectives.toml", sets, out, timeout=3000)
    rows = []
    for r in read_csv(out / "collectives.csv"):
        t = float(r["emulated_s"])
        rows.append({"setup": setup["key"], "op": r["op"], "ranks": int(r["ranks"]),
                     "bytes": int(r["bytes"]), "algorithm": r["algorithm"],
                     "protocol": r["protocol"], "time_us": t * 1e6,
                     "algbw_GBps": float(r["algbw_GBps"]), "busbw_GBps": float(r["busbw_GBps"])})
    return rows


def compare(ours: list[Row], setup_list: list[dict[str, Any]]) -> list[Row]:
    """Ours beside every measured row of the setups' datasets, with the busbw error."""
    by_key = {(r["setup"], r["op"], r["bytes"]): r for r in ours}
    out = []
    for st in setup_list:
        for m in measured():
            if m["dataset"] not in st["datasets"] or int(m["bytes"]) < 1024:
                continue
            r = by_key.get((st["key"], m["collective"], int(m["bytes"])))
            if r is None or not m["busbw_GBps"] or float(m["busbw_GBps"]) <= 0:
                continue
            meas = float(m["busbw_GBps"])
            out.append({"setup": st["key"], "dataset": m["dataset"], "op": r["op"],
                        "bytes": r["bytes"], "algorithm": r["algorithm"],
                        "protocol": r["protocol"], "ours_busbw_GBps": r["busbw_GBps"],
                        "measured_busbw_GBps": meas,
                        "error": r["busbw_GBps"] / meas - 1})
    return out


def targets_error(rows: list[Row]) -> tuple[float, float]:
    """(geomean |busbw error| from 1 MiB up, over all sizes) of these points (nan: none)."""
    def gm(rs: list[Row]) -> float:
        return geomean(max(abs(r["error"]), 1e-6) for r in rs)
    return gm([r for r in rows if r["bytes"] >= MiB]), gm(rows)


def summarize(cmp: list[Row]) -> list[Row]:
    """Geometric mean of |busbw error| per dataset, over all sizes and from 1 MiB up."""
    out = []
    fitted = calibrated(cmp)
    for ds in dict.fromkeys(r["dataset"] for r in cmp):
        rows = [r for r in cmp if r["dataset"] == ds]
        big, every = targets_error(rows)
        out.append({"dataset": ds, "setup": rows[0]["setup"], "points": len(rows),
                    "geomean_abs_error_all": every,
                    "geomean_abs_error_1MiB_up": None if math.isnan(big) else big,
                    "mean_signed_error": sum(r["error"] for r in rows) / len(rows),
                    "calibration": "fitted on" if ds in fitted else "held out"})
    return out


def sweep(keys: list[str] | None, sets: list[str] | None = None) -> list[Row]:
    chosen = [s for s in setups() if not keys or s["key"] in keys]
    with tempfile.TemporaryDirectory() as tmp:
        return [r for st in chosen
                for r in emulate({**st, "sets": [*st["sets"], *(sets or [])]}, Path(tmp))]


def calibration() -> dict[str, Any]:
    """The data sets that fit the latency scales, and their grid."""
    return dict(load_figures("collectives")["calibration"].value)


def calibrated(cmp: list[Row]) -> set[str]:
    """The data sets the latency scales were fitted on (the others are held out)."""
    fit = set(calibration()["datasets"])
    return {r["dataset"] for r in cmp if r["dataset"] in fit}


def calibrate() -> list[Row]:
    """For each point of the grid, the call scale (`call`), the LL, LL128 and Simple hop
    scales (`hop_<protocol>`) and the errors on the calibration data sets from 1 MiB up and
    over all sizes; the fit is the point of the least mean of the two (`fit`)."""
    cal = calibration()
    fit = set(cal["datasets"])
    chosen = [s for s in setups() if fit & set(s["datasets"])]
    hop = cal["hop"]
    out = []
    for call, *hops in itertools.product(cal["call"], *(hop[p] for p in PROTOCOLS)):
        point = {"call": float(call), **{f"hop_{p}": float(k) for p, k in zip(PROTOCOLS, hops)}}
        sets = [f"network.call_latency_scale={call}",
                *(f"network.hop_latency_scale.{p}={k}" for p, k in zip(PROTOCOLS, hops))]
        ours = sweep([s["key"] for s in chosen], sets)
        big, every = targets_error([r for r in compare(ours, chosen) if r["dataset"] in fit])
        out.append({**point, "error_1MiB_up": big, "error_all": every})
    return out


def read_calibration(path: Path) -> list[Row]:
    """The grid `calibrate` wrote (`calibration.csv`), as numbers; empty if absent."""
    return [{k: float(v) for k, v in r.items()} for r in read_csv(path)] \
        if path.exists() else []


def fit(table: list[Row]) -> Row:
    """The grid point of the least mean of the two target errors (the calibration's rule)."""
    return min(table, key=lambda r: (r["error_1MiB_up"] + r["error_all"]) / 2)


def golden() -> list[Golden]:
    """The 8-GPU DGX H100 setup (8 ranks, timing only) against its committed rows."""
    return [Golden("emulated.csv", sweep(["h100x8"]), lambda r: r["setup"] == "h100x8")]

"""`mpiemu report comp_vs_comm`: thesis (seed 003) chapter 5, computation vs communication as
Transformers and hardware scale, from emulated runs (not formulas).

Every point is one transformer layer (forward + backward) of the `layer_sweep` kind on real
MPI ranks, timing only (`workloads/comp_vs_comm.toml`, MI210 preset, the network of
`comp_vs_comm.toml`): one job per TP degree of `--tp` (4 to 256, Table 5.1) for the
serialized TP shares (Figs. 5.9, 5.12), one TP x DP job for the FC weight's DP all-reduce
against the backward GEMMs that hide it (Figs. 5.10, 5.11; the thesis's region of interest),
each over H x SL x B x compute scale, and Fig. 5.13's case point at its TP with its DP step. Each
job folds onto one process (`run.fold`: its TP x DP ranks are symmetric; bit-identical times,
tests/test_fold.py). Writes tp.csv, dp.csv, case.csv, tp_share.png, dp_share.png and README.md
(`comp_vs_comm_report.py`). Golden test: the scale 1, H <= 8K rows of tp.csv (TP = 4) and dp.csv.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from ..net.spec import NetworkSpec
from ..runner.collective_sweep import bus_factor
from . import runs as launch
from ..workloads import DIR as WORKLOADS_DIR
from .common import Golden, Row, load_figures, read_csv

WORKLOAD = WORKLOADS_DIR / "comp_vs_comm.toml"
INTS = ("point", "hidden", "seq_len", "batch", "tp", "dp")
KEEP = ("hidden", "seq_len", "batch", "tp", "dp", "compute_scale", "time_s", "compute_s",
        "gemm_s", "attn_core_s", "tp_comm_s", "tp_share", "bwd_gemm_s", "dp_comm_s",
        "dp_over_bwd", "dp_layer_s")
GOLDEN_H = 8192


def figures() -> dict[str, Any]:
    return {k: v.value for k, v in load_figures("comp_vs_comm").items()}


def valid_hidden(hidden: list[int], tp: int, head_dim: int) -> list[int]:
    """The H whose heads (H / head_dim) split over tp ranks."""
    return [h for h in hidden if h % head_dim == 0 and (h // head_dim) % tp == 0]


def _list(xs: list[Any]) -> str:
    return "[" + ", ".join(str(x) for x in xs) + "]"


def sweep(tp: int, dp: int, runs: Path, hidden: list[int] | None = None,
          scales: list[float] | None = None, extra: list[str] = ()) -> list[Row]:  # type: ignore[assignment]
    """One `layer_sweep` job on tp x dp ranks; its rows (H that do not split are left out)."""
    f = figures()
    hs = valid_hidden(hidden or f["hidden"], tp, f["head_dim"])
    if not hs:
        return []
    out = runs / f"tp{tp}-dp{dp}"
    sets = [f"parallel.tp={tp}", f"parallel.dp={dp}", f"device.preset='{f['device']}'",
            f"layer_sweep.hidden={_list(hs)}", f"layer_sweep.seq_len={_list(f['seq_len'])}",
            f"layer_sweep.batch={_list(f['batch'])}", f"layer_sweep.head_dim={f['head_dim']}",
            f"layer_sweep.compute_scale={_list(scales or f['compute_scales'])}",
            *f["network"], *extra]
    n = launch.processes(WORKLOAD, sets, tp * dp)     # folded (one process) where exact
    print(f"running: mpiexec -n {n} mpiemu run {WORKLOAD.name} (tp={tp}, dp={dp}, "
          f"{len(hs)} H)", flush=True)
    launch.run(n, WORKLOAD, sets, out, timeout=3000)
    rows = []
    for r in read_csv(out / "layer_sweep.csv"):
        row: Row = {k: int(r[k]) if k in INTS else float(r[k]) for k in KEEP}
        row["highlighted"] = row["hidden"] // row["tp"] == f["highlighted_h_per_tp"]
        rows.append(row)
    return rows


def golden() -> list[Golden]:
    """The compute-scale 1 rows with H <= 8K of the TP = 4 job and of the TP x DP job: two
    folded jobs of a few seconds each."""
    f = figures()
    hs, g = [h for h in f["hidden"] if h <= GOLDEN_H], f["dp_grid"]
    with tempfile.TemporaryDirectory(prefix="mpiemu-cvc-") as tmp:
        tp_rows = sweep(4, 1, Path(tmp), hs, [1.0])
        dp_rows = sweep(g["tp"], g["dp"], Path(tmp), hs, [1.0])

    def small(r: dict[str, str]) -> bool:
        return float(r["compute_scale"]) == 1 and int(r["hidden"]) <= GOLDEN_H

    return [Golden("tp.csv", tp_rows, lambda r: r["tp"] == "4" and small(r)),
            Golden("dp.csv", dp_rows, small)]


def trend(rows: list[Row], key: str, vary: str, rising: bool) -> tuple[int, int]:
    """How many neighbouring pairs (only `vary` changes) move `key` the stated way."""
    fixed = [c for c in ("hidden", "seq_len", "batch", "tp", "compute_scale") if c != vary]
    groups: dict[tuple[Any, ...], list[Row]] = {}
    for r in rows:
        groups.setdefault(tuple(r[c] for c in fixed), []).append(r)
    ok = total = 0
    for g in groups.values():
        g.sort(key=lambda r: r[vary])
        for a, b in zip(g, g[1:]):
            total += 1
            ok += (b[key] > a[key]) == rising
    return ok, total


def sweep_network() -> tuple[NetworkSpec, bool]:
    """The network the sweep runs on (the device's preset with the study's overrides) and
    whether its rings are bidirectional."""
    from ..config.workload import load_workload, resolve_device, resolve_network  # noqa: PLC0415
    f = figures()
    w = load_workload(WORKLOAD, [*f["network"], f"device.preset='{f['device']}'"])
    return resolve_network(w, resolve_device(w)), w.overlap.bidirectional


def fc_grad_bytes(r: Row) -> float:
    """The FC weight's gradient in bytes, fp16 (Eq. 5.8: 4H x H / TP elements)."""
    return 4 * r["hidden"] ** 2 / r["tp"] * 2


def dp_busbw(r: Row) -> float:
    """The DP all-reduce's bus bandwidth (nccl-tests' busbw of its emulated time)."""
    return bus_factor("all_reduce", r["dp"]) * fc_grad_bytes(r) / r["dp_comm_s"]

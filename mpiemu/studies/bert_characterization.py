"""`mpiemu report bert_characterization`: thesis (seed 003) chapter 4, BERT-Large on one
MI100 (which ops take the time) and trained TP / DP (how much of it is communication),
regenerated from emulated runs of `workloads/bert-large-mi100.toml` (timing only).

* `breakdown.csv`: per run of Fig. 4.1 (phase 1/2, B = 32/4, FP32 / mixed precision) and op
  category (`CATEGORIES`, matched on trace op names), emulated ms and share of the iteration;
* `multi.csv`: S1, D1, D2, T1, T2 of 4.5.2 (PCIe 4.0 links of the preset): exposed TP and DP
  communication and the LAMB share, rank 0's breakdown (`analysis.breakdown`);
* `breakdown.png`; README.md with every figure beside the thesis's.
Golden test: the Ph1-B32 rows of `breakdown.csv` (two one-rank runs) and T1 of `multi.csv`.
"""
from __future__ import annotations

import re
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

from . import runs as launch
from ..workloads import DIR as WORKLOADS_DIR
from .common import Golden, Row, load_figures

WORKLOAD = WORKLOADS_DIR / "bert-large-mi100.toml"
LAYER = re.compile(r"^l\d+\.")
# (category, pattern on the op name without its layer prefix); the first match wins
CATEGORIES: tuple[tuple[str, str], ...] = (
    ("lamb", r"^optim\."),
    ("embedding_output", r"^(embed|head|lne|lnf)\."),
    ("attention_linear", r"^(qkv|proj)\.(fwd\.gemm|bwd\.gemm|wgrad)$"),
    ("fc", r"^(fc1|fc2)\.(fwd\.gemm|bwd\.gemm|wgrad)$"),
    ("attention_bgemm", r"^attn\.(score|context|bwd\.(dq|dk|dv|dprobs))$"),
    ("scale_mask_dr_softmax", r"^attn\.(scale|mask|softmax|dropout|bwd\.)"),
    ("gelu", r"^gelu\."),
    ("dr_rc_ln", r"^((attn|mlp)\.(bias_dropout_add|residual)|ln[12]\.)"),
    ("other", r""),
)
GEMM = re.compile(r"(\.gemm|\.wgrad|^attn\.(score|context)|^attn\.bwd\.(dq|dk|dv|dprobs))$")


def category(op: str) -> str:
    """The category of a trace op name (layer prefix `lN.` ignored)."""
    bare = LAYER.sub("", op)
    return next(c for c, pat in CATEGORIES if re.search(pat, bare))


def _sets(cfg: dict[str, Any]) -> list[str]:
    return [f"model.seq_len={cfg['seq_len']}", f"train.global_batch={cfg['global_batch']}",
            f"run.emulated_dtype='{cfg['dtype']}'"]


def breakdown_rows(runs: Path, labels: tuple[str, ...] = ()) -> list[Row]:
    """Per Fig. 4.1 run: emulated ms and share per category, GEMM / non-GEMM, layers."""
    from ..analysis import load  # noqa: PLC0415
    from ..devices.presets import load_device  # noqa: PLC0415
    fig = load_figures("bert_characterization")
    spec = load_device(str(fig["device"].value))
    rows: list[Row] = []
    for cfg in fig["breakdown_runs"].value:
        if labels and cfg["label"] not in labels:
            continue
        out = runs / cfg["label"]
        launch.run(1, WORKLOAD, _sets(cfg), out)
        rt = load(out).ranks[0]
        ev = rt.events
        dur = ev["t_end"] - ev["t_start"]
        total = float(ev["t_end"].max() - ev["t_start"].min())
        sums: dict[str, float] = defaultdict(float)
        for d, name, cat, flops in zip(dur, rt.names, rt.cats, ev["flops"]):
            if cat != "compute":
                continue
            name = str(name)
            sums[category(name)] += float(d)
            gemm = bool(GEMM.search(LAYER.sub("", name)))
            sums["all_gemm" if gemm else "non_gemm"] += float(d)
            if gemm:          # the same GEMMs at the matrix peak: a lower bound of their time
                sums["gemm_at_peak"] += float(flops) / spec.peak(cfg["dtype"])
            if LAYER.match(name):
                sums["layers"] += float(d)
        sums["attention_bgemm_softmax"] = sums["attention_bgemm"] + \
            sums["scale_mask_dr_softmax"]
        for c in [c for c, _ in CATEGORIES] + ["attention_bgemm_softmax", "all_gemm",
                                               "non_gemm", "layers", "gemm_at_peak"]:
            rows.append({"run": cfg["label"], "category": c, "ms": sums[c] * 1e3,
                         "share": sums[c] / total})
    return rows


def multi_rows(runs: Path, labels: tuple[str, ...] = ()) -> list[Row]:
    """S1, D1, D2, T1, T2: exposed TP / DP communication and LAMB shares (rank 0)."""
    from ..analysis import load  # noqa: PLC0415
    from ..analysis.breakdown import iteration_breakdown  # noqa: PLC0415
    fig = load_figures("bert_characterization")
    rows: list[Row] = []
    for cfg in fig["multi_runs"].value:
        if labels and cfg["label"] not in labels:
            continue
        out = runs / cfg["label"]
        sets = [f"parallel.tp={cfg['tp']}", f"parallel.dp={cfg['dp']}",
                f"train.global_batch={cfg['global_batch']}", "run.emulated_dtype='fp32'"]
        if not cfg["overlap"]:
            sets.append("train.dp_bucket_MiB=1e9")     # one bucket after backward
        launch.run(cfg["tp"] * cfg["dp"], WORKLOAD, sets, out)
        rt = load(out).ranks[0]
        b = iteration_breakdown(rt, 0)
        ev = rt.events
        lamb = sum(float(e1 - e0) for e0, e1, n, c in zip(ev["t_start"], ev["t_end"],
                                                          rt.names, rt.cats)
                   if str(n).startswith("optim.") and c == "compute")
        rows.append({"config": cfg["label"], "tp": cfg["tp"], "dp": cfg["dp"],
                     "global_batch": cfg["global_batch"], "iteration_ms": b.iteration_s * 1e3,
                     "compute_ms": b.compute_s * 1e3, "tp_exposed_ms": b.tp_exposed_s * 1e3,
                     "dp_exposed_ms": b.dp_exposed_s * 1e3, "dp_total_ms": b.dp_total_s * 1e3,
                     "comm_share": (b.tp_exposed_s + b.dp_exposed_s) / b.iteration_s,
                     "lamb_share": lamb / b.iteration_s})
    return rows


def golden() -> list[Golden]:
    """The Ph1-B32 breakdown rows (FP32 and MP) and T1 (two ranks)."""
    keep = ("Ph1-B32-FP32", "Ph1-B32-MP")
    with tempfile.TemporaryDirectory(prefix="mpiemu-bert-") as tmp:
        br = breakdown_rows(Path(tmp), keep)
        mu = multi_rows(Path(tmp), ("T1",))
    return [Golden("breakdown.csv", br, lambda r: r["run"] in keep),
            Golden("multi.csv", mu, lambda r: r["config"] == "T1")]

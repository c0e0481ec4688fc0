"""The kernels study's second data set: kernels measured on this project's own H100 SXM5
(`kernels_h100_here.csv`, from `benchmarks/device/measure_kernels.py` and
`megatron_kernels.py`), beside the GPU model with the shipped `h100-sxm5` preset.

Nothing is fitted on these rows: they judge the GEMM model (Megatron layer GEMMs and
attention BMMs at TP 8, probes sweeping the BMMs' short dimension), the memory-bound kernel
model (`devices.kernels`: PyTorch's and Megatron-LM's own kernels at the 22B and 175B layers'
shapes) and the FlashAttention-2 model (`devices.attention_gpu.flash_cost`).
"""
from __future__ import annotations

import csv
import io
import tempfile
from importlib import resources
from pathlib import Path
from typing import Callable

import numpy as np

from ..devices import kernels as hk
from ..devices.attention_gpu import AttnShape, flash_cost
from ..devices.cost import GpuCost
from ..devices.kernels import Kernel
from ..devices.presets import load_device
from ..workloads import DIR as WORKLOADS_DIR
from .common import Row, geomean

GPU = "h100-sxm5"
E = 2                                              # every measured kernel ran in fp16
LAYER_GROUPS = ("22B", "175B", "530B", "1T")       # the Megatron workloads at TP 8
SWEEPS = ("k-sweep", "n-sweep", "mn-sweep")
FILES = {"gemm": "measured_here_gemms.csv", "kernel": "measured_here_kernels.csv",
         "flash": "measured_here_flash.csv"}
LAYER_FILE = "measured_here_layers.csv"


def packaged_csv(name: str) -> tuple[str, list[dict[str, str]]]:
    """(the provenance lines, the rows) of a measured-here CSV shipped in mpiemu.studies:
    its `# ` lines say where and how it was measured."""
    text = (resources.files("mpiemu.studies") / name).read_text()
    head = [ln[2:] for ln in text.splitlines() if ln.startswith("# ")]
    body = "\n".join(ln for ln in text.splitlines() if not ln.startswith("#"))
    return "; ".join(head), list(csv.DictReader(io.StringIO(body)))


def measurements() -> dict[tuple[str, str, int, int, int, int], dict[str, str]]:
    """The published grid (`kernels_measured.csv`) by (gpu, dtype, M, N, K, batch)."""
    text = (resources.files("mpiemu.studies") / "kernels_measured.csv").read_text()
    rows = read_csv_text(text)
    return {(r["gpu"], r["dtype"], int(r["m"]), int(r["n"]), int(r["k"]), int(r["batch"])): r
            for r in rows}


def read_csv_text(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def raw() -> tuple[str, list[dict[str, str]]]:
    """(the provenance lines, the rows) of the kernels measured here."""
    return packaged_csv("kernels_h100_here.csv")


def _dims(shape: str) -> list[int]:
    return [int(x) for x in shape.split()[0].split("x")]


def _softmax(mode: str, backward: bool, loaded: float = 1.0, dropout: bool = False
             ) -> Callable[[list[int]], list[Kernel]]:
    tag = {(False, False): "softmax", (True, False): "softmax.bwd",
           (False, True): "dropout"}[(backward, dropout)]

    def kernels(d: list[int]) -> list[Kernel]:
        ks = hk.softmax(d[0] * d[1] * d[2], E, mode, dropout, False, backward, loaded=loaded)
        return [k for k in ks if k.tag == tag]
    return kernels


def _causal(backward: bool) -> Callable[[list[int]], list[Kernel]]:
    def kernels(d: list[int]) -> list[Kernel]:
        return _softmax("fused", backward, (d[2] + 1) / (2 * d[2]))(d)
    return kernels


# measured op -> the model's kernels for its shape (rows x width, or heads x rows x keys)
KERNELS: dict[tuple[str, str], Callable[[list[int]], list[Kernel]]] = {
    ("kernel", "softmax fwd"): _softmax("unfused", False),
    ("kernel", "softmax bwd"): _softmax("unfused", True),
    ("kernel", "scale"): lambda d: [Kernel(0, d[0] * d[1] * d[2] * E, d[0] * d[1] * d[2] * E)],
    ("kernel", "dropout"): _softmax("unfused", False, dropout=True),
    ("kernel", "layernorm fwd"): lambda d: hk.layernorm(d[0], d[1], E),
    # autograd asked for the input's gradient only: the gamma / beta kernel does not run
    ("kernel", "layernorm bwd"): lambda d: hk.layernorm(d[0], d[1], E, backward=True)[1:],
    ("kernel", "bias gelu fwd (unfused)"): lambda d: hk.bias_gelu(d[0], d[1], E, "unfused"),
    ("kernel", "gelu fwd"): lambda d: hk.bias_gelu(d[0], d[1], E, "unfused")[1:],
    ("kernel", "gelu bwd"): lambda d: hk.bias_gelu(d[0], d[1], E, "unfused", True)[:1],
    ("kernel", "add"): lambda d: [Kernel(d[0] * d[1], 2 * d[0] * d[1] * E, d[0] * d[1] * E)],
    ("kernel", "copy"): lambda d: [Kernel(0, _n(d) * E, _n(d) * E)],
    ("kernel", "cast to fp32"): lambda d: [Kernel(0, d[0] * d[1] * E, d[0] * d[1] * 4)],
    ("megatron", "causal softmax fwd"): _causal(False),
    ("megatron", "causal softmax bwd"): _causal(True),
    ("megatron", "layernorm fwd"): lambda d: hk.layernorm(d[0], d[1], E),
    ("megatron", "layernorm bwd"): lambda d: hk.layernorm(d[0], d[1], E, backward=True),
}


def _n(d: list[int]) -> int:
    out = 1
    for x in d:
        out *= x
    return out


def gemm_rows(model: GpuCost, rows: list[dict[str, str]]) -> list[Row]:
    out = []
    for r in rows:
        if r["kind"] != "gemm" or r["group"] not in LAYER_GROUPS + SWEEPS:
            continue
        m, n, k, b = (int(r[x]) for x in ("m", "n", "k", "batch"))
        c = model.gemm(m, n, k, dtype=r["dtype"], batch=b, layout=r["layout"])
        meas = float(r["time_us"])
        out.append({"group": r["group"], "op": r["op"], "m": m, "n": n, "k": k, "batch": b,
                    "layout": r["layout"], "ours_us": round(c.time_s * 1e6, 2),
                    "measured_us": meas, "ours_tflops": round(c.tflops, 1),
                    "measured_tflops": float(r["tflops"]),
                    "error": round(c.time_s * 1e6 / meas - 1, 4),
                    "bmm": b > 1, "measured_dram_tbps":
                    round(2 * b * (m * k + k * n + m * n) / meas / 1e6, 2)})
    return out


def kernel_rows(model: GpuCost, rows: list[dict[str, str]]) -> list[Row]:
    out = []
    for r in rows:
        fn = KERNELS.get((r["kind"], r["op"]))
        if fn is None:
            continue
        ks = fn(_dims(r["shape"]))
        ours = sum(model.elementwise_s(k.read_bytes, k.write_bytes, k.flops,
                                       sfu_ops=k.sfu_ops, bw_util=k.bw_util) for k in ks)
        meas = float(r["time_us"])
        tri = sum(model.elementwise_s(k.read_bytes, k.write_bytes, k.flops,
                                      sfu_ops=k.sfu_ops) for k in ks)   # bytes at full rate
        out.append({"source": "Megatron-LM" if r["kind"] == "megatron" else "PyTorch",
                    "op": r["op"], "group": r["group"], "shape": r["shape"],
                    "kernels": len(ks), "ours_us": round(ours * 1e6, 2), "measured_us": meas,
                    "error": round(ours * 1e6 / meas - 1, 4),
                    "model_bytes_MB": round(sum(k.dram_bytes for k in ks) / 1e6, 1),
                    "full_rate_us": round(tri * 1e6, 2)})
    return out


def flash_rows(rows: list[dict[str, str]]) -> list[Row]:
    spec = load_device(GPU)
    out = []
    for r in rows:
        if r["kind"] != "flash":
            continue
        b, nh, s, d = _dims(r["shape"])
        a = AttnShape(b * nh, s, s, d, E, causal="causal" in r["shape"], training=True)
        f = flash_cost(spec, a, "fp16", backward=r["op"] == "bwd")
        meas = float(r["time_us"])
        out.append({"case": r["group"], "pass": r["op"], "shape": r["shape"],
                    "ours_us": round(f.time_s * 1e6, 2), "measured_us": meas,
                    "error": round(f.time_s * 1e6 / meas - 1, 4)})
    return out


def published_vs_here(rows: list[dict[str, str]]) -> list[Row]:
    """The published H100 grid re-measured here: how far two measurements of one shape
    can sit apart (method: L2-warm CUDA-graph replay here)."""
    pub = measurements()
    out = []
    for r in rows:
        key = (GPU, r["dtype"], int(r["m"] or 0), int(r["n"] or 0), int(r["k"] or 0),
               int(r["batch"] or 1))
        if r["group"] == "published-grid" and key in pub:
            theirs = float(pub[key]["tflops"])
            out.append({"dtype": r["dtype"], "shape": f"{key[2]}x{key[3]}x{key[4]}",
                        "source": pub[key]["source"], "published_tflops": round(theirs, 1),
                        "here_tflops": float(r["tflops"]),
                        "here_over_published": round(float(r["tflops"]) / theirs - 1, 4)})
    return out


def all_rows() -> dict[str, list[Row]]:
    model = GpuCost(load_device(GPU))
    _, rows = raw()
    return {"gemm": gemm_rows(model, rows), "kernel": kernel_rows(model, rows),
            "flash": flash_rows(rows), "published": published_vs_here(rows)}


def summary(t: dict[str, list[Row]]) -> list[Row]:
    """Geomean |time error| and mean signed error per group of the measured-here rows."""
    groups: dict[str, list[Row]] = {}
    for r in t["gemm"]:
        if r["group"] in LAYER_GROUPS:
            groups.setdefault(f"layer GEMMs ({'attention BMMs' if r['bmm'] else 'dense'})",
                              []).append(r)
        else:
            groups.setdefault("BMM probes (sweeps)", []).append(r)
    for r in t["kernel"]:
        groups.setdefault(f"memory-bound kernels ({r['source']})", []).append(r)
    groups["FlashAttention-2 (SDPA)"] = t["flash"]
    return [{"set": k, "rows": len(v),
             "geomean_abs_error": round(geomean(max(abs(r["error"]), 1e-6) for r in v), 4),
             "mean_error": round(sum(r["error"] for r in v) / len(v), 4)}
            for k, v in groups.items()]


# measured layer -> (model preset, micro-batch): the shards benchmarks/device/ timed
LAYERS = {"22B TP8": ("megatron-22b", 4), "175B TP8": ("megatron-175b", 1)}
SCALE = ("attn.scale", "attn.bwd.scale.bwd")   # Megatron's unfused scale kernels (fwd, bwd)
GEMM_OPS = ("attn.score", "attn.context", "attn.bwd.dprobs", "attn.bwd.dv", "attn.bwd.dq",
            "attn.bwd.dk")                    # the attention BMMs (the rest: .gemm, .wgrad)


def emulated_layer_s(model: str, micro_batch: int, out: Path) -> dict[str, float]:
    """One layer's compute on an emulated H100 as the measured plain-PyTorch layer runs it:
    TP 8, unfused kernels, no SP, no recompute, layer 1 of a two-layer run, rank 0; the
    gradient-buffer hooks (`.grad_acc`, Megatron's DDP, absent from plain autograd) left
    out. `fwd` and `fwd+bwd`, each with and without (`.noscale`) the scale kernels
    Megatron's unfused softmax path runs and PyTorch's baddbmm folds into its GEMM."""
    from ..analysis import load  # noqa: PLC0415
    from .runs import run  # noqa: PLC0415
    run(8, WORKLOADS_DIR / "megatron-22b-tp8.toml",
        [f"model.preset={model}", "model.layers=2", f"train.micro_batch={micro_batch}",
         f"train.global_batch={micro_batch}", "device.preset=h100-sxm5",
         "network.preset=dgx-h100", "parallel.sequence_parallel=false",
         "train.recompute=none", "train.kernels=unfused"], out)
    rt = load(out).ranks[0]
    ev, names = rt.events, rt.names.astype(str)
    dur = ev["t_end"] - ev["t_start"]
    mine = ((ev["layer"] == 1) & np.char.startswith(rt.resources.astype(str), "compute")
            & ~np.char.endswith(names, ".grad_acc"))
    ops = np.char.partition(names, ".")[:, 2]                 # "l1.attn.score" -> "attn.score"
    noscale = mine & ~np.isin(ops, SCALE)
    phase = rt.phases.astype(str)
    gemm = mine & (np.char.endswith(names, ".gemm") | np.char.endswith(names, ".wgrad")
                   | np.isin(ops, GEMM_OPS))
    out_s = {"gemm": float(dur[gemm & np.isin(phase, ("fwd", "bwd"))].sum())}
    for op, phases in (("fwd", ("fwd",)), ("fwd+bwd", ("fwd", "bwd"))):
        sel = np.isin(phase, phases)
        out_s[op] = float(dur[mine & sel].sum())
        out_s[op + ".noscale"] = float(dur[noscale & sel].sum())
    return out_s


def profiled_gemm_us() -> dict[str, float]:
    """GPU time of the cuBLAS kernels (GEMMs and BMMs) in each profiled fwd + bwd layer."""
    out: dict[str, float] = {}
    for r in packaged_csv("kernels_h100_layer_profile.csv")[1]:
        if "nvjet" in r["kernel"] or "gemm" in r["kernel"].lower():
            out[r["layer"]] = out.get(r["layer"], 0.0) + float(r["total_us"])
    return out


def layer_rows(rows: list[dict[str, str]]) -> list[Row]:
    """The plain-PyTorch layer's measured time beside ours, with and without the scale
    kernels the measured layer does not run; for fwd + bwd, the GEMMs' share of each (the
    measured one from the layer's kernel profile)."""
    meas = {(r["group"], r["op"]): float(r["time_us"]) for r in rows if r["kind"] == "layer"}
    prof = profiled_gemm_us()
    out = []
    for group, (model, mb) in LAYERS.items():
        with tempfile.TemporaryDirectory(prefix="mpiemu-kernels-") as tmp:
            ours = emulated_layer_s(model, mb, Path(tmp))
        for op in ("fwd", "fwd+bwd"):
            theirs = meas[(group, op)]
            out.append({"layer": group, "pass": op, "measured_us": theirs,
                        "ours_us": round(ours[op] * 1e6, 1),
                        "error": round(ours[op] * 1e6 / theirs - 1, 4),
                        "ours_without_scale_us": round(ours[op + ".noscale"] * 1e6, 1),
                        "error_without_scale": round(ours[op + ".noscale"] * 1e6 / theirs
                                                     - 1, 4),
                        "measured_gemm_us": prof[group] if op == "fwd+bwd" else "",
                        "ours_gemm_us": round(ours["gemm"] * 1e6, 1) if op == "fwd+bwd"
                        else ""})
    return out

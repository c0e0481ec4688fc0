"""`mpiemu report kernels`: emulated GEMM throughput of transformer-layer shapes beside
published measurements (A100, H100), and the fit of the GEMM model's two global constants
(the H100's per-wave latency, the A100's matrix-unit efficiency).

Each Megatron layer of `kernels.toml` has nine GEMMs (projection, FC-1, FC-2; forward,
activation gradient, weight gradient); each shape with a published measurement
(`kernels_measured.csv`, a source per row) becomes a row: ours from `devices.gemm` with the
shipped presets, theirs, the error. The H100 rows of the calibration layers (and the H100
MAMF point its efficiency comes from) and the A100 rows `calibrate_a100` names fit the
constants; every other row judges the model. Golden test: the whole `gemms.csv` (under a
second); the grid searches that chose the constants the presets carry run only in
`mpiemu report kernels`.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from ..devices.cost import GpuCost
from ..devices.presets import load_device
from ..devices.specs import DeviceSpec
from . import kernels_here
from .common import Golden, Row, geomean, load_figures
from .kernels_here import measurements

PASSES = ("fwd", "dgrad", "wgrad")
LAYOUT = {"fwd": "NN", "dgrad": "NT", "wgrad": "TN"}
COOKBOOK_OPS = {(8192, 12288, 4096): "qkv fwd", (8192, 4096, 4096): "proj fwd",
                (8192, 16384, 4096): "fc1 fwd", (8192, 4096, 16384): "fc2 fwd",
                (8192, 51200, 4096): "logits fwd", (2048, 2048, 256): "attn score BMM",
                (2048, 256, 2048): "attn context BMM"}
OTHER_USES = {"mamf_h100": "max achievable (MAMF)", "mamf_a100": "max achievable (MAMF)",
              "azure_ndv4": "cuBLASLt benchmark shape"}


def layer_gemms(hidden: int, tokens: int, tp: int) -> list[tuple[str, str, int, int, int]]:
    """(op, pass, M, N, K) of a Megatron layer's projection and MLP GEMMs on one TP rank.

    forward Y[T, out] = X[T, in] W; activation gradient dX[T, in] = dY W^T; weight gradient
    dW[in, out] = X^T dY (K = tokens). Projection and FC-2 are row-parallel, FC-1 column-.
    """
    h, t, f = hidden, tokens, 4 * hidden
    io = {"proj": (h // tp, h), "fc1": (h, f // tp), "fc2": (f // tp, h)}
    out = []
    for op, (i, o) in io.items():
        out += [(op, "fwd", t, o, i), (op, "dgrad", t, i, o), (op, "wgrad", i, o, t)]
    return out


def _cases() -> list[Row]:
    """Every measured shape once: gpu, dtype, shape, the layer GEMMs using it, its set."""
    fig, meas = load_figures("kernels"), measurements()
    cal_bf16, cal_tf32 = set(fig["calibrate_layers"].value), set(fig["calibrate_tf32_layers"].value)
    cases: dict[tuple[str, str, int, int, int, int], Row] = {}
    for layer in fig["layers"].value:
        for op, p, m, n, k in layer_gemms(layer["hidden"], layer["tokens"], layer["tp"]):
            for dtype in ("bf16", "tf32"):
                key = ("h100-sxm5", dtype, m, n, k, 1)
                if key not in meas:
                    continue
                c = cases.setdefault(key, {"uses": [], "cal": False, "layout": LAYOUT[p]})
                c["uses"].append(f"{layer['name']} {op} {p}")
                c["cal"] |= layer["name"] in (cal_bf16 if dtype == "bf16" else cal_tf32)
    cal_a100 = {tuple(x) for x in fig["calibrate_a100"].value}
    for key, r in meas.items():
        if r["source"] != "xla_sm90":
            c = cases.setdefault(key, {"uses": [], "cal": _calibrates(key, r["source"], cal_a100),
                                       "layout": "NN"})
            c["uses"].append(COOKBOOK_OPS.get(key[2:5], OTHER_USES.get(r["source"], "")))
    return [{"key": key, **c, "meas": meas[key]} for key, c in cases.items()]


def _calibrates(key: tuple[str, str, int, int, int, int], source: str,
                cal_a100: set[tuple[int, ...]]) -> bool:
    """Whether a non-XLA row fits a constant: the H100 MAMF point (its efficiency) and the
    A100 rows `calibrate_a100` names (its efficiency); every other row judges."""
    if key[0] == "h100-sxm5":
        return source.startswith("mamf")
    return source == "azure_ndv4" and key[2:5] in cal_a100


def rows_for(specs: dict[str, DeviceSpec]) -> list[Row]:
    """The study's table: one row per measured shape, ours beside theirs."""
    models = {g: GpuCost(s) for g, s in specs.items()}
    out = []
    for c in _cases():
        gpu, dtype, m, n, k, batch = c["key"]
        cost = models[gpu].gemm(m, n, k, dtype=dtype, batch=batch, layout=c["layout"])
        theirs = float(c["meas"]["tflops"])
        out.append({"gpu": gpu, "dtype": dtype, "m": m, "n": n, "k": k, "batch": batch,
                    "layout": c["layout"], "used_by": "; ".join(c["uses"]),
                    "set": "calibrate" if c["cal"] else "judge",
                    "ours_tflops": round(cost.tflops, 2), "measured_tflops": round(theirs, 2),
                    "error": round(cost.tflops / theirs - 1, 4),
                    "tile": f"{cost.tile_m}x{cost.tile_n}", "split_k": cost.split_k,
                    "waves": cost.n_stages, "source": c["meas"]["source"]})
    return sorted(out, key=lambda r: (r["gpu"], r["dtype"], r["set"], r["m"], r["n"], r["k"]))


def shipped() -> dict[str, DeviceSpec]:
    return {g: load_device(g) for g in ("a100-sxm4-80gb", "h100-sxm5")}


def summary(rows: list[Row]) -> list[Row]:
    """Geomean |error| per GPU and set, and over every judged row."""
    out = []
    groups = sorted({(r["gpu"], r["set"]) for r in rows}) + [("all", "judge")]
    for gpu, s in groups:
        sel = [r for r in rows if r["set"] == s and gpu in ("all", r["gpu"])]
        out.append({"gpu": gpu, "set": s, "rows": len(sel),
                    "geomean_abs_error": round(geomean(max(abs(r["error"]), 1e-6)
                                                       for r in sel), 4),
                    "max_abs_error": round(max(abs(r["error"]) for r in sel), 4)})
    return out


def fit(grid: dict[str, list[float]]) -> tuple[float, float, float, float]:
    """The two fitted constants, each on its own GPU's calibration rows (geomean |error|):
    (H100 wave_fixed_s, its error, A100 matrix-unit efficiency, its error)."""
    h100, a100 = load_device("h100-sxm5"), load_device("a100-sxm4-80gb")

    def err(gpu: str, spec: DeviceSpec) -> float:
        rows = rows_for({"h100-sxm5": spec if gpu == "h100-sxm5" else h100,
                         "a100-sxm4-80gb": spec if gpu == "a100-sxm4-80gb" else a100})
        return geomean(max(abs(r["error"]), 1e-6) for r in rows
                       if r["gpu"] == gpu and r["set"] == "calibrate")

    wf = min(((err("h100-sxm5", _with_gemm(h100, wave_fixed_s=w * 1e-6)), w * 1e-6)
              for w in grid["wave_fixed_us"]))
    eff = min(((err("a100-sxm4-80gb", _with_gemm(a100, efficiency=e)), e)
               for e in grid["a100_efficiency"]))
    return wf[1], wf[0], eff[1], eff[0]


def _with_gemm(spec: DeviceSpec, **changes: Any) -> DeviceSpec:
    return dataclasses.replace(spec, gemm=dataclasses.replace(spec.gemm, **changes))


def golden() -> list[Golden]:
    here = kernels_here.all_rows()
    return [Golden("gemms.csv", rows_for(shipped()))] + [
        Golden(name, here[kind]) for kind, name in kernels_here.FILES.items()] + [
        Golden(kernels_here.LAYER_FILE, kernels_here.layer_rows(kernels_here.raw()[1]))]

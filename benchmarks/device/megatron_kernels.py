"""Measure Megatron-LM's own fused kernels (its causal softmax and mixed-precision layer
norm, megatron/fused_kernels/ at de593298, built here for the GPU at hand) and profile the
plain-PyTorch GPT layer of `measure_kernels.py` kernel by kernel.

Run where a CUDA GPU, PyTorch and nvcc exist, with a copy of Megatron-LM's
megatron/fused_kernels/ (not shipped here: `git show de593298:megatron/fused_kernels/<file>`
for compat.h, type_shim.h, layer_norm_cuda.cpp, layer_norm_cuda_kernel.cu and the three
scaled_upper_triang_masked_softmax files):

    python3 benchmarks/device/megatron_kernels.py --src DIR --out megatron_kernels.csv \
        --profile layer_profile.csv

Timing as in `measure_kernels.py` (CUDA-graph replay, median of three).
"""
from __future__ import annotations

import argparse
import csv
import sys
import tempfile
from pathlib import Path

import torch
from torch.utils import cpp_extension

sys.path.insert(0, str(Path(__file__).parent))
from measure_kernels import (MODELS, TP, layer_case, rand, timed_us,  # noqa: E402
                             write_rows)

FLAGS = ["-O3", "-DAT_ASSERTM=TORCH_CHECK", "-gencode", "arch=compute_90,code=sm_90", "--use_fast_math",
         "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
         "--expt-relaxed-constexpr", "--expt-extended-lambda"]


def build(src: Path, name: str, files: list[str], extra: list[str]) -> object:
    out = Path(tempfile.mkdtemp())
    return cpp_extension.load(name=name, sources=[str(src / f) for f in files],
                              build_directory=str(out), extra_cflags=["-O3", "-DAT_ASSERTM=TORCH_CHECK"],
                              extra_cuda_cflags=FLAGS + extra, verbose=False)


def softmax_rows(ext: object) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for name, h, a, s, mb in MODELS[:2]:
        heads = mb * a // TP
        x = rand(heads, s, s, dtype="fp16")
        y = ext.forward(x, 0.125)                       # type: ignore[attr-defined]
        g = rand(heads, s, s, dtype="fp16")
        for op, fn, nbytes in (
                ("causal softmax fwd", lambda: ext.forward(x, 0.125), 2 * x.numel() * 2),  # type: ignore[attr-defined]
                ("causal softmax bwd", lambda: ext.backward(g, y, 0.125), 3 * x.numel() * 2)):  # type: ignore[attr-defined]
            us, how = timed_us(fn)
            rows.append({"kind": "megatron", "group": f"{name} TP8", "op": op,
                         "shape": f"{heads}x{s}x{s}", "time_us": round(us, 3),
                         "gbps": round(nbytes / us / 1e3, 1), "timing": how})
            print(rows[-1], flush=True)
    return rows


def layernorm_rows(ext: object) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for name, h, a, s, mb in MODELS[:2]:
        for sp in (False, True):
            t = s * mb // (TP if sp else 1)
            x, dy = rand(t, h, dtype="fp16"), rand(t, h, dtype="fp16")
            gamma, beta = rand(h, dtype="fp16"), rand(h, dtype="fp16")
            out, mean, invvar = ext.forward_affine(x, (h,), gamma, beta, 1e-5)  # type: ignore[attr-defined]
            for op, fn, nbytes in (
                    ("layernorm fwd", lambda: ext.forward_affine(x, (h,), gamma, beta, 1e-5),  # type: ignore[attr-defined]
                     2 * x.numel() * 2),
                    ("layernorm bwd", lambda: ext.backward_affine(  # type: ignore[attr-defined]
                        dy, mean, invvar, x, (h,), gamma, beta, 1e-5), 3 * x.numel() * 2)):
                us, how = timed_us(fn)
                rows.append({"kind": "megatron", "group": f"{name} TP8" + (" SP" if sp else ""),
                             "op": op, "shape": f"{t}x{h}", "time_us": round(us, 3),
                             "gbps": round(nbytes / us / 1e3, 1), "timing": how})
                print(rows[-1], flush=True)
    return rows


def profile_layer(path: Path) -> None:
    """Per-kernel GPU time of one fwd+bwd of each plain-PyTorch layer (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["layer", "kernel", "calls", "total_us"])
        for name, h, a, s, mb in MODELS[:2]:
            step = layer_case(h, a, s, mb, True)
            for _ in range(3):
                step()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    step()
                torch.cuda.synchronize()
            for e in prof.key_averages():
                if e.device_time_total > 0:
                    w.writerow([f"{name} TP8", e.key[:200], e.count // 5,
                                round(e.device_time_total / 5, 3)])
    print(f"# wrote {path}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--src", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--profile", type=Path)
    args = ap.parse_args()
    rows: list[dict[str, object]] = []
    if args.profile:
        profile_layer(args.profile)
    for label, fn in (
            ("softmax", lambda: softmax_rows(build(
                args.src, "scaled_upper_triang_masked_softmax_cuda",
                ["scaled_upper_triang_masked_softmax.cpp",
                 "scaled_upper_triang_masked_softmax_cuda.cu"], []))),
            ("layernorm", lambda: layernorm_rows(build(
                args.src, "fused_mix_prec_layer_norm_cuda",
                ["layer_norm_cuda.cpp", "layer_norm_cuda_kernel.cu"], ["-maxrregcount=50"])))):
        try:
            rows += fn()
        except Exception as exc:  # noqa: BLE001 - report the build failure, go on
            print(f"# {label} failed: {str(exc)[-1500:]}", flush=True)
    fields = ["kind", "group", "op", "shape", "time_us", "gbps", "timing"]
    write_rows(args.out, f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA "
               f"{torch.version.cuda}; Megatron-LM fused kernels at de593298", fields, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

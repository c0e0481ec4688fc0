"""LayerNorm over a grid of rows x width, forward and backward: PyTorch's native kernels and
Megatron-LM's mixed-precision LayerNorm (megatron/fused_kernels/ at de593298, built here),
fp16. The data a row-level model of these kernels needs: how their time grows with rows at
a width, and with width at a row count. Run where a CUDA GPU, PyTorch and nvcc exist (not
in CI):

    python3 benchmarks/device/layernorm_grid.py --src DIR --out layernorm_grid.csv
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from measure_kernels import rand, timed_us, write_rows  # noqa: E402
from megatron_kernels import build  # noqa: E402

ROWS = (256, 1024, 4096, 16384)
WIDTHS = (1024, 4096, 6144, 12288, 25600)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--src", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    ext = build(args.src, "fused_mix_prec_layer_norm_cuda",
                ["layer_norm_cuda.cpp", "layer_norm_cuda_kernel.cu"], ["-maxrregcount=50"])
    rows: list[dict[str, object]] = []
    for w in WIDTHS:
        for r in ROWS:
            x, dy = rand(r, w, dtype="fp16"), rand(r, w, dtype="fp16")
            g, b = rand(w, dtype="fp16"), rand(w, dtype="fp16")
            _, mean, invvar = ext.forward_affine(x, (w,), g, b, 1e-5)  # type: ignore[attr-defined]
            cases = (
                ("megatron", "fwd", lambda: ext.forward_affine(x, (w,), g, b, 1e-5)),  # type: ignore[attr-defined]
                ("megatron", "bwd", lambda: ext.backward_affine(  # type: ignore[attr-defined]
                    dy, mean, invvar, x, (w,), g, b, 1e-5)),
                ("torch", "fwd", lambda: F.layer_norm(x, (w,), g, b)))
            for stack, op, fn in cases:
                us, how = timed_us(fn)
                rows.append({"kind": "layernorm", "group": stack, "op": op,
                             "shape": f"{r}x{w}", "time_us": round(us, 3), "timing": how})
                print(rows[-1], flush=True)
    write_rows(args.out, f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}; "
               "Megatron-LM LayerNorm at de593298", ["kind", "group", "op", "shape",
                                                     "time_us", "timing"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

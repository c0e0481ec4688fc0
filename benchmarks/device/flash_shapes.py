"""FlashAttention-2 (PyTorch SDPA's flash backend) over a grid that separates its costs:
causal against full attention, few against many heads, head dim 64 / 128, forward and
backward. Run where a CUDA GPU and PyTorch exist (not in CI):

    python3 benchmarks/device/flash_shapes.py --out flash_shapes.csv
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from measure_kernels import _eager_us, flash_case  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    rows = []
    for heads in (12, 96):
        for d in (64, 128):
            for causal in (False, True):
                for backward in (False, True):
                    fn = flash_case(1, heads, 2048, d, causal, backward)
                    for _ in range(3):
                        fn()
                    # eager: a failed graph capture of SDPA's backward spoils the RNG state
                    us, how = sorted(_eager_us(fn, 20) for _ in range(3))[1], "eager"
                    rows.append({"kind": "flash", "group": "grid", "op": "bwd" if backward
                                 else "fwd", "dtype": "fp16", "batch": 1,
                                 "shape": f"1x{heads}x2048x{d}" + (" causal" if causal else ""),
                                 "time_us": round(us, 3), "timing": how})
                    print(rows[-1], flush=True)
    with args.out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

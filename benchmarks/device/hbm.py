"""HBM rates by direction: read only (a sum), write only (a fill), read + write (a copy), at
footprints inside and well beyond L2, through PyTorch, CUDA-graph replayed as in
`measure_kernels.py`. Run where a CUDA GPU and PyTorch exist (not in CI):

    python3 benchmarks/device/hbm.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from measure_kernels import timed_us  # noqa: E402


def main() -> int:
    print(f"# {torch.cuda.get_device_name(0)}: GB/s of bytes moved (fp16 elements)")
    for mib in (32, 256, 1024, 4096):
        n = mib * 2**20 // 2
        x = torch.randn(n, device="cuda", dtype=torch.float16)
        y = torch.empty_like(x)
        out = torch.empty((), device="cuda", dtype=torch.float32)
        cases = (("read (sum)", lambda: torch.sum(x, dim=(0,), dtype=torch.float32, out=out), 2 * n),
                 ("write (fill)", lambda: y.fill_(1.0), 2 * n),
                 ("copy", lambda: y.copy_(x), 4 * n))
        for name, fn, nbytes in cases:
            us, how = timed_us(fn)
            print(f"MiB={mib} op={name} GBps={nbytes / us / 1e3:.1f} timing={how}", flush=True)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())

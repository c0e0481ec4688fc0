"""Measure fp32 atomicAdd (RED) throughput into global memory, the way FlashAttention-2's
backward accumulates dQ: coalesced, one float per thread, into a buffer that fits L2 and one
that does not. Prints GB/s of accumulated data. Run where a CUDA GPU and CuPy exist (not in
CI):  python3 benchmarks/device/atomics.py
"""
from __future__ import annotations

import sys

import cupy as cp

SRC = r"""
extern "C" __global__ void red_loop(float* buf, long n, int reps) {
  long stride = (long)gridDim.x * blockDim.x;
  for (int r = 0; r < reps; ++r)
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
      atomicAdd(buf + i, 1.0f);
}
"""


def main() -> int:
    kern = cp.RawKernel(SRC, "red_loop")
    sms = cp.cuda.Device(0).attributes["MultiProcessorCount"]
    name = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    print(f"# {name}, {sms} SMs: atomicAdd f32, coalesced")
    for mib in (8, 16, 32, 100, 400):
        n = mib * 2**20 // 4
        buf = cp.zeros(n, dtype=cp.float32)
        reps = max(1, 400 // mib)
        args = (buf, cp.int64(n), cp.int32(reps))
        kern((sms * 8,), (256,), args)
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        kern((sms * 8,), (256,), args)
        end.record()
        end.synchronize()
        ms = cp.cuda.get_elapsed_time(start, end)
        print(f"buffer_MiB={mib} GBps={4.0 * n * reps / ms / 1e6:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Measure the tensor-core rate of the Ampere-style `mma.sync` instruction (m16n8k16, fp16
in, fp32 accumulate): the instruction FlashAttention-2 issues on every GPU it runs on,
Hopper included (it has no wgmma path). Prints TFLOP/s for a few warps-per-SM counts.

Run where a CUDA GPU and CuPy exist (not in CI):  python3 benchmarks/device/mma_sync.py
Each warp keeps 8 independent accumulators in flight so the instruction's latency is
hidden; operands stay in registers, so nothing but the tensor cores is measured.
"""
from __future__ import annotations

import sys

import cupy as cp

SRC = r"""
extern "C" __global__ void mma_loop(float* out, int iters) {
  unsigned a0 = 0x3c003c00u, a1 = 0x3c003c00u, a2 = 0x3c003c00u, a3 = 0x3c003c00u;
  unsigned b0 = 0x3c003c00u, b1 = 0x3c003c00u;
  float c[8][4];
  for (int j = 0; j < 8; ++j) for (int q = 0; q < 4; ++q) c[j][q] = 0.f;
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                   "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                   : "+f"(c[j][0]), "+f"(c[j][1]), "+f"(c[j][2]), "+f"(c[j][3])
                   : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
  }
  float s = 0.f;
  for (int j = 0; j < 8; ++j) for (int q = 0; q < 4; ++q) s += c[j][q];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
"""


def main() -> int:
    kern = cp.RawKernel(SRC, "mma_loop")
    sms = cp.cuda.Device(0).attributes["MultiProcessorCount"]
    name = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    iters = 20000
    print(f"# {name}, {sms} SMs: mma.sync m16n8k16 f16 -> f32")
    for warps in (4, 8, 16, 32):
        blocks, threads = sms * max(1, warps // 8), 32 * min(warps, 8)
        out = cp.zeros(blocks * threads, dtype=cp.float32)
        kern((blocks,), (threads,), (out, cp.int32(iters)))            # warm-up
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        kern((blocks,), (threads,), (out, cp.int32(iters)))
        end.record()
        end.synchronize()
        ms = cp.cuda.get_elapsed_time(start, end)
        flops = 2.0 * 16 * 8 * 16 * 8 * iters * blocks * threads / 32
        print(f"warps_per_sm={warps} tflops={flops / ms / 1e9:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

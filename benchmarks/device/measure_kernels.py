"""Measure, on a real GPU, the kernels the GPU model charges: a transformer layer's GEMMs
and attention BMMs as Megatron-LM calls them, its memory-bound kernels as PyTorch runs
them, and FlashAttention-2 through PyTorch's SDPA. Writes one CSV row per case.

Run where a CUDA GPU and PyTorch exist (not in CI: the emulator needs neither):

    python3 benchmarks/device/measure_kernels.py --out kernels_measured_here.csv

Method: random normal data (zeros run faster); each case is warmed up, captured as a CUDA
graph of back-to-back calls lasting about 5 ms and replayed three times, timed with CUDA
events; the median per-call time is kept (column `timing`: `graph`, or `eager` for a case
that refuses capture). Graph replay removes Python's launch cost but keeps the GPU's own
gaps between kernels, as a training step's stream has them. The shapes are the emulator's Megatron workloads (22B, 175B,
530B, 1T at TP 8; `mpiemu/models/`), seed 004's attention studies and the kernels study's
published grid (`mpiemu/studies/kernels_measured.csv`).
"""
from __future__ import annotations

import argparse
import csv
import math
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

# name, hidden, heads, seq, micro-batch: the Megatron-LM configurations of results/megatron/
MODELS = [("22B", 6144, 64, 2048, 4), ("175B", 12288, 96, 2048, 1),
          ("530B", 20480, 128, 2048, 1), ("1T", 25600, 160, 2048, 1)]
TP = 8
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32,
          "tf32": torch.float32}


def _eager_us(fn: Callable[[], object], reps: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / reps


def _graph(fn: Callable[[], object], reps: int) -> torch.cuda.CUDAGraph:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    return g


def timed_us(fn: Callable[[], object]) -> tuple[float, str]:
    """Median over three trials of the mean per-call GPU time of `reps` back-to-back calls
    replayed from one CUDA graph (so Python's launch cost, tens of microseconds here, does
    not hide small kernels); eager calls where a case cannot be captured."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    try:
        probe = _graph(fn, 4)
        once_us = _eager_us(probe.replay, 3) / 4
        reps = max(4, min(1000, math.ceil(5000.0 / max(once_us, 1.0))))
        del probe
        g = _graph(fn, reps)
        g.replay()
        torch.cuda.synchronize()
        trials = [_eager_us(g.replay, 1) / reps for _ in range(3)]
        del g
        return statistics.median(trials), "graph"
    except Exception as exc:  # noqa: BLE001 - some ops refuse capture: time them eagerly
        print(f"# eager ({type(exc).__name__}: {str(exc)[:80]})", flush=True)
        torch.cuda.synchronize()
        once = _eager_us(fn, 1)
        reps = max(5, min(2000, math.ceil(20000.0 / max(once, 1.0))))
        return statistics.median(_eager_us(fn, reps) for _ in range(3)), "eager"


def rand(*shape: int, dtype: str) -> torch.Tensor:
    return torch.randn(*shape, device="cuda", dtype=DTYPES[dtype])


def gemm_case(dtype: str, m: int, n: int, k: int, layout: str, batch: int = 1
              ) -> Callable[[], object]:
    """C[M,N] = op(A) op(B) in row-major torch terms: layout 'NN' A[M,K] B[K,N]; 'NT'
    A[M,K] B[N,K]^T (torch's linear forward); 'TN' A[K,M]^T B[K,N] (a weight gradient)."""
    pre = (batch,) if batch > 1 else ()
    a = rand(*pre, *((k, m) if layout[0] == "T" else (m, k)), dtype=dtype)
    b = rand(*pre, *((n, k) if layout[1] == "T" else (k, n)), dtype=dtype)
    at = a.transpose(-1, -2) if layout[0] == "T" else a
    bt = b.transpose(-1, -2) if layout[1] == "T" else b
    return lambda: torch.matmul(at, bt)


def gemm_rows() -> list[dict[str, object]]:
    """(group, op, dtype, m, n, k, batch, layout) of every GEMM case."""
    out: list[dict[str, object]] = []

    def add(group: str, op: str, dtype: str, m: int, n: int, k: int, batch: int = 1,
            layout: str = "NN") -> None:
        out.append(dict(group=group, op=op, dtype=dtype, m=m, n=n, k=k, batch=batch,
                        layout=layout))

    for name, h, a, s, mb in MODELS:
        t, d, heads = s * mb, h // a, mb * a // TP
        # Megatron linear layers: y = x W^T with W[out, in]; dgrad dx = dy W; wgrad dW = dy^T x
        for op, i, o in (("qkv", h, 3 * h // TP), ("proj", h // TP, h),
                         ("fc1", h, 4 * h // TP), ("fc2", 4 * h // TP, h)):
            add(name, f"{op} fwd", "fp16", t, o, i, layout="NT")
            add(name, f"{op} dgrad", "fp16", t, i, o, layout="NN")
            add(name, f"{op} wgrad", "fp16", o, i, t, layout="TN")
        # attention core (megatron/model/transformer.py CoreAttention at de593298)
        add(name, "score fwd", "fp16", s, s, d, heads, "NT")      # q k^T
        add(name, "context fwd", "fp16", s, d, s, heads, "NN")    # P v
        add(name, "dprobs bwd", "fp16", s, s, d, heads, "NT")     # dctx v^T
        add(name, "dv bwd", "fp16", s, d, s, heads, "TN")         # P^T dctx
        add(name, "dq bwd", "fp16", s, d, s, heads, "NN")         # dS k
        add(name, "dk bwd", "fp16", s, d, s, heads, "TN")         # dS^T q
        add(name, "logits fwd", "fp16", t, 51200 // TP, h, layout="NT")
    for k in (16, 32, 64, 96, 128, 192, 256, 384, 512, 1024, 2048):   # score-BMM K sweep
        add("k-sweep", "score", "fp16", 2048, 2048, k, 16, "NT")
    for n in (32, 64, 96, 128, 160, 256, 512):                         # context-BMM N sweep
        add("n-sweep", "context", "fp16", 2048, n, 2048, 16, "NN")
    for mn in (1024, 2048, 4096, 8192):                                # square output, K 128
        add("mn-sweep", "score", "fp16", mn, mn, 128, max(1, 16 * 2048 ** 2 // mn ** 2), "NT")
    here = Path(__file__).resolve().parents[2] / "mpiemu/studies/kernels_measured.csv"
    with here.open() as f:
        for r in csv.DictReader(f):
            dtype = r["dtype"] if r["gpu"] == "h100-sxm5" else "fp16"
            add("published-grid", r["source"], dtype, int(r["m"]), int(r["n"]), int(r["k"]),
                int(r["batch"]))
    return out


def kernel_rows() -> list[tuple[str, str, Callable[[], object], float]]:
    """(name, shape, fn, DRAM bytes a minimal kernel moves) of memory-bound PyTorch ops at
    the 22B layer's per-rank shapes (fp16)."""
    _, h, a, s, mb = MODELS[0]
    t, heads, f = s * mb, mb * a // TP, 4 * h // TP
    e = 2
    sc = rand(heads, s, s, dtype="fp16")
    p = torch.softmax(sc, -1)
    g = rand(heads, s, s, dtype="fp16")
    x = rand(t, h, dtype="fp16")
    w, b = rand(h, dtype="fp16"), rand(h, dtype="fp16")
    dy = rand(t, h, dtype="fp16")
    y = rand(t, f, dtype="fp16")
    dyf = rand(t, f, dtype="fp16")
    bias = rand(f, dtype="fp16")
    x32 = rand(t, 51200 // TP, dtype="fp16")
    n_sc, n_x, n_y = heads * s * s, t * h, t * f
    xr = x.detach().requires_grad_(True)
    ln_out = F.layer_norm(xr, (h,), w, b)

    def ln_bwd() -> object:
        return torch.autograd.grad(ln_out, xr, dy, retain_graph=True)

    yr = y.detach().requires_grad_(True)
    ge = F.gelu(yr)

    def gelu_bwd() -> object:
        return torch.autograd.grad(ge, yr, dyf, retain_graph=True)

    s4 = rand(16, 4096, 4096, dtype="fp16")                   # seed 004: L = 4096, 16 heads
    p4 = torch.softmax(s4, -1)
    g4 = rand(16, 4096, 4096, dtype="fp16")
    n4 = s4.numel()
    return [
        ("softmax fwd", "16x4096x4096", lambda: torch.softmax(s4, -1), 2 * n4 * e),
        ("softmax bwd", "16x4096x4096",
         lambda: torch._softmax_backward_data(g4, p4, -1, torch.float16), 3 * n4 * e),
        ("copy", "16x4096x4096", lambda: s4.clone(), 2 * n4 * e),
        ("softmax fwd", f"{heads}x{s}x{s}", lambda: torch.softmax(sc, -1), 2 * n_sc * e),
        ("softmax bwd", f"{heads}x{s}x{s}",
         lambda: torch._softmax_backward_data(g, p, -1, torch.float16), 3 * n_sc * e),
        ("scale", f"{heads}x{s}x{s}", lambda: sc * 0.125, 2 * n_sc * e),
        ("dropout", f"{heads}x{s}x{s}", lambda: F.dropout(p, 0.1), 2 * n_sc * e + n_sc),
        ("layernorm fwd", f"{t}x{h}", lambda: F.layer_norm(x, (h,), w, b), 2 * n_x * e),
        ("layernorm bwd", f"{t}x{h}", ln_bwd, 3 * n_x * e),
        ("bias gelu fwd (unfused)", f"{t}x{f}", lambda: F.gelu(y + bias), 4 * n_y * e),
        ("gelu fwd", f"{t}x{f}", lambda: F.gelu(y), 2 * n_y * e),
        ("gelu bwd", f"{t}x{f}", gelu_bwd, 3 * n_y * e),
        ("add", f"{t}x{h}", lambda: x + dy, 3 * n_x * e),
        ("copy", f"{t}x{h}", lambda: x.clone(), 2 * n_x * e),
        ("cast to fp32", f"{t}x{51200 // TP}", lambda: x32.float(), 6 * t * 51200 // TP),
    ]


def flash_rows() -> list[tuple[str, int, int, int, int, bool]]:
    """(name, batch, heads, seq, head_dim, causal) for FlashAttention-2 via SDPA."""
    out = [("BERT-Large L4096", 1, 16, 4096, 64, False),
           ("GPT-Neo-1.3B L4096", 1, 16, 4096, 128, True)]
    for name, h, a, s, mb in MODELS:
        out.append((f"{name} TP8", mb, a // TP, s, h // a, True))
    return out


def flash_case(b: int, nh: int, s: int, d: int, causal: bool, backward: bool
               ) -> Callable[[], object]:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v = (rand(b, nh, s, d, dtype="fp16").requires_grad_(backward) for _ in range(3))
    do = rand(b, nh, s, d, dtype="fp16")

    def fwd() -> object:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    if not backward:
        return fwd
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def bwd() -> object:
        return torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
    return bwd


def layer_case(h: int, a: int, s: int, b: int, backward: bool) -> Callable[[], object]:
    """One Megatron-LM GPT layer's TP-rank shard (TP 8, no sequence parallelism, no
    recomputation) in plain PyTorch fp16, as megatron/model/transformer.py at de593298
    writes it with its fused kernels unavailable: LN, QKV linear, baddbmm scores, causal
    masked_fill, softmax, dropout, bmm context, projection (its all-reduce left out: one GPU),
    bias + dropout + residual, LN, FC-1 + bias, GeLU, FC-2, bias + dropout + residual."""
    np_, hn = a // TP, h // a

    def w(*shape: int) -> torch.Tensor:
        return (rand(*shape, dtype="fp16") * 0.02).requires_grad_(True)
    wqkv, bqkv, wo, bo = w(3 * h // TP, h), w(3 * h // TP), w(h, h // TP), w(h)
    w1, b1, w2, b2 = w(4 * h // TP, h), w(4 * h // TP), w(h, 4 * h // TP), w(h)
    g1, be1, g2, be2 = w(h), w(h), w(h), w(h)
    mask = torch.triu(torch.ones(s, s, device="cuda", dtype=torch.bool), 1)
    x = rand(s, b, h, dtype="fp16").requires_grad_(True)
    params = [x, wqkv, bqkv, wo, bo, w1, b1, w2, b2, g1, be1, g2, be2]

    def fwd() -> torch.Tensor:
        ln = F.layer_norm(x, (h,), g1, be1)
        qkv = F.linear(ln, wqkv, bqkv).view(s, b, np_, 3 * hn)  # [s, b, np, 3 hn]
        q, k, v = torch.split(qkv, hn, dim=-1)
        q, k, v = (t.reshape(s, b * np_, hn) for t in (q, k, v))  # [s, b np, hn]
        sc = torch.baddbmm(torch.empty(b * np_, s, s, device="cuda", dtype=torch.float16),
                           q.transpose(0, 1), k.transpose(0, 1).transpose(1, 2),
                           beta=0.0, alpha=1.0 / math.sqrt(hn))   # [b np, s, s]
        sc = sc.view(b, np_, s, s).masked_fill(mask, -10000.0)
        pr = F.dropout(torch.softmax(sc, -1), 0.1).view(b * np_, s, s)
        ctx = torch.bmm(pr, v.transpose(0, 1))                   # [b np, s, hn]
        ctx = ctx.view(b, np_, s, hn).permute(2, 0, 1, 3).reshape(s, b, h // TP)
        x1 = x + F.dropout(F.linear(ctx, wo) + bo, 0.1)
        ln2 = F.layer_norm(x1, (h,), g2, be2)
        f = F.gelu(F.linear(ln2, w1, b1))
        return x1 + F.dropout(F.linear(f, w2) + b2, 0.1)
    if not backward:
        return fwd
    dy = rand(s, b, h, dtype="fp16")

    def step() -> object:
        return torch.autograd.grad(fwd(), params, dy)
    return step


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--only", default="gemm,kernel,flash,layer")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    prop = torch.cuda.get_device_properties(0)
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,"
                          "clocks.max.mem", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    print(f"# device {prop.name}, {prop.multi_processor_count} SMs, torch {torch.__version__},"
          f" CUDA {torch.version.cuda}, nvidia-smi: {smi}", flush=True)
    fields = ["kind", "group", "op", "dtype", "m", "n", "k", "batch", "layout", "shape",
              "time_us", "tflops", "gbps", "timing"]
    rows: list[dict[str, object]] = []
    torch.manual_seed(0)
    if "gemm" in args.only:
        for c in gemm_rows():
            torch.backends.cuda.matmul.allow_tf32 = c["dtype"] == "tf32"
            try:
                fn = gemm_case(str(c["dtype"]), int(c["m"]), int(c["n"]), int(c["k"]),  # type: ignore[arg-type]
                               str(c["layout"]), int(c["batch"]))  # type: ignore[arg-type]
                us, how = timed_us(fn)
            except Exception as exc:  # noqa: BLE001 - record and go on
                print(f"# skip {c}: {exc}", flush=True)
                continue
            flops = 2.0 * c["m"] * c["n"] * c["k"] * c["batch"]  # type: ignore[operator]
            rows.append({**c, "kind": "gemm", "time_us": round(us, 3), "timing": how,
                         "tflops": round(flops / us / 1e6, 2)})
            print(rows[-1], flush=True)
            del fn
            torch.cuda.empty_cache()
        torch.backends.cuda.matmul.allow_tf32 = False
    if "kernel" in args.only:
        for name, shape, fn, nbytes in kernel_rows():
            us, how = timed_us(fn)
            rows.append({"kind": "kernel", "timing": how, "op": name, "dtype": "fp16", "shape": shape,
                         "time_us": round(us, 3), "gbps": round(nbytes / us / 1e3, 1)})
            print(rows[-1], flush=True)
        torch.cuda.empty_cache()
    if "flash" in args.only:
        for name, b, nh, s, d, causal in flash_rows():
            for backward in (False, True):
                try:
                    us, how = timed_us(flash_case(b, nh, s, d, causal, backward))
                except Exception as exc:  # noqa: BLE001
                    print(f"# skip flash {name}: {exc}", flush=True)
                    continue
                pairs = b * nh * s * s * (0.5 if causal else 1.0)
                flops = (10.0 if backward else 4.0) * pairs * d
                rows.append({"kind": "flash", "timing": how, "group": name, "op": "bwd" if backward else "fwd",
                             "dtype": "fp16", "batch": b, "shape": f"{b}x{nh}x{s}x{d}"
                             + (" causal" if causal else ""), "time_us": round(us, 3),
                             "tflops": round(flops / us / 1e6, 2)})
                print(rows[-1], flush=True)
                torch.cuda.empty_cache()
    if "layer" in args.only:
        for name, h, a, s, mb in MODELS[:2]:
            for backward in (False, True):
                us, how = timed_us(layer_case(h, a, s, mb, backward))
                rows.append({"kind": "layer", "timing": how, "group": f"{name} TP8", "dtype": "fp16",
                             "op": "fwd+bwd" if backward else "fwd", "batch": mb,
                             "shape": f"h{h} a{a} s{s} b{mb}", "time_us": round(us, 3)})
                print(rows[-1], flush=True)
                torch.cuda.empty_cache()
    write_rows(args.out, f"{prop.name}, {prop.multi_processor_count} SMs, torch "
               f"{torch.__version__}, CUDA {torch.version.cuda}, {smi}", fields, rows)
    return 0


def write_rows(path: Path, provenance: str, fields: list[str],
               rows: list[dict[str, object]]) -> None:
    """The CSV every device script writes: a provenance comment, then one row per case."""
    with path.open("w", newline="") as f:
        f.write(f"# {provenance}\n")
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in fields})
    print(f"# wrote {len(rows)} rows to {path}", flush=True)


if __name__ == "__main__":
    sys.exit(main())

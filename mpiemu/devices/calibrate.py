"""`mpiemu calibrate`: measure this host as a device and write a preset TOML.

GEMM rate from a large numpy matmul, streaming bandwidth from a large copy, launch overhead
from a one-element ufunc call, cache size from sysfs; under `mpiexec -n 2` (or more) the
network's latency and bandwidth come from an MPI ping-pong between ranks 0 and 1 and go into a
network preset beside it (`<out>-net.toml`, which the device preset names). Every number's source
says how and when it was measured, so the preset can be checked in and compared later.
"""
from __future__ import annotations

import datetime as _dt
import os
import platform
import time
from pathlib import Path
from typing import Callable

import numpy as np


def _best(fn: Callable[[], object], reps: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def gemm_rate(dtype: type, n: int = 1024) -> float:
    """flop/s of an n x n x n numpy matmul."""
    a: np.ndarray = np.random.default_rng(0).standard_normal((n, n)).astype(dtype)
    b = a.T.copy()
    return 2.0 * n**3 / _best(lambda: a @ b, reps=3)


def stream_bw(nbytes: int = 256 << 20) -> float:
    """bytes/s of a large array copy (read + write)."""
    src = np.ones(nbytes // 8)
    dst = np.empty_like(src)
    return 2.0 * nbytes / _best(lambda: np.copyto(dst, src), reps=3)


def launch_s() -> float:
    """Seconds of the smallest numpy kernel: the host's per-op overhead."""
    x, z = np.ones(1), np.zeros(1)
    n = 2000
    return _best(lambda: [np.add(x, z, out=x) for _ in range(n)]) / n


def vector_rate(n: int = 1 << 14) -> float:
    """flop/s of an in-cache elementwise add (one flop per element)."""
    x, y = np.ones(n, np.float32), np.zeros(n, np.float32)
    reps = 200
    return reps * n / _best(lambda: [np.add(x, y, out=x) for _ in range(reps)])


def llc_bytes() -> float:
    for idx in (3, 2):
        p = Path(f"/sys/devices/system/cpu/cpu0/cache/index{idx}/size")
        if p.exists():
            text = p.read_text().strip()
            scale = {"K": 2**10, "M": 2**20}.get(text[-1], 1)
            return float(text.rstrip("KM")) * scale
    return 8.0 * 2**20


def ping_pong(comm: object, nbytes: int) -> float:
    """One-way seconds for nbytes between ranks 0 and 1 (half the best round trip)."""
    from mpi4py import MPI  # noqa: PLC0415
    c: MPI.Comm = comm  # type: ignore[assignment]
    buf = np.zeros(max(nbytes, 1), np.uint8)

    def once() -> None:
        if c.rank == 0:
            c.Send(buf, 1, 9)
            c.Recv(buf, 1, 9)
        elif c.rank == 1:
            c.Recv(buf, 0, 9)
            c.Send(buf, 0, 9)
    c.Barrier()
    return _best(once, reps=10) / 2


def _q(value: float, source: str) -> str:
    return f"{{ value = {value:.6g}, source = \"{source}\" }}"


def calibrate(out: Path) -> list[str]:
    """Measure, write the preset to `out`, and return lines to print (rank 0)."""
    from mpi4py import MPI  # noqa: PLC0415
    comm = MPI.COMM_WORLD
    lat = bw = None
    if comm.size >= 2:
        lat = ping_pong(comm, 8)
        big = 64 << 20
        bw = big / max(ping_pong(comm, big) - lat, 1e-12)
    if comm.rank != 0:
        return []
    host, when = platform.node() or "host", _dt.date.today().isoformat()
    out = Path(out)
    net_out = out.with_name(out.stem + "-net.toml")
    net_path = str(net_out.resolve())
    src = f"measured by mpiemu calibrate on {host} {when}"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    fp32, fp64, mem = gemm_rate(np.float32), gemm_rate(np.float64), stream_bw()
    text = f"""# This host as an mpiemu device, {src}.
name = "{host}"
kind = "gpu"
network = "{net_path}"
description = "host CPU measured by mpiemu calibrate (numpy BLAS, {cores} cores)"

[compute]
compute_units = {_q(cores or 1, "os.sched_getaffinity on " + host)}
clock_GHz = {_q(1.0, "ASSUMPTION: the rate model uses measured flop/s, not the clock")}
peak_fp32_TFLOPS = {_q(fp32 / 1e12, src + ": 1024^3 numpy matmul, fp32")}
peak_fp64_TFLOPS = {_q(fp64 / 1e12, src + ": 1024^3 numpy matmul, fp64")}
peak_fp16_TFLOPS = {_q(fp32 / 1e12, "ASSUMPTION: numpy has no fast fp16 GEMM; fp32 rate")}
peak_bf16_TFLOPS = {_q(fp32 / 1e12, "ASSUMPTION: numpy has no fast bf16 GEMM; fp32 rate")}
vector_fp32_TFLOPS = {_q(vector_rate() / 1e12, src + ": in-cache fp32 np.add")}
kernel_launch_us = {_q(launch_s() * 1e6, src + ": one-element np.add")}

[memory]
dram_bw_GBps = {_q(mem / 1e9, src + ": 256 MiB np.copyto, read+write")}
dram_capacity_GiB = {_q(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30,
                        "sysconf physical pages on " + host)}
llc_MiB = {_q(llc_bytes() / 2**20, "sysfs cpu0 cache size on " + host)}
dram_efficiency_frac = {_q(1.0, "measured bandwidth is already the achievable one")}

[gemm]
tile_m_count = {_q(64, "ASSUMPTION: BLAS blocking of order 64")}
tile_n_count = {_q(64, "ASSUMPTION: BLAS blocking of order 64")}
wgs_per_cu_count = {_q(1, "ASSUMPTION: one block per core")}
efficiency_frac = {_q(1.0, "measured rate is already the achievable one")}

"""
    net = f"""# The MPI network between this host's ranks, {src}.
name = "{host}-mpi"
description = "MPI point-to-point between ranks on {host}, measured by mpiemu calibrate"
topology = "switch"

[intra]
bw_GBps = {_q((bw or 10e9) / 1e9, src + ": 64 MiB MPI ping-pong"
              if bw else "ASSUMPTION: no second rank to measure; 10 GB/s")}
latency_simple_us = {_q((lat or 1e-6) * 1e6, src + ": 8 B MPI ping-pong"
                        if lat else "ASSUMPTION: no second rank to measure; 1 us")}

[collectives]
efficiency_simple_frac = {_q(1.0, "the measured rate is already the achieved one")}
"""
    out.write_text(text)
    net_out.write_text(net)
    return [f"wrote {out}: fp32 {fp32 / 1e9:.1f} GFLOP/s, fp64 {fp64 / 1e9:.1f} GFLOP/s, "
            f"copy {mem / 1e9:.1f} GB/s" + (f", link {bw / 1e9:.2f} GB/s {lat * 1e6:.2f} us"
                                            if bw and lat else ""),
            f"and {net_out} (its network); use it with: --set device.preset={out}"]

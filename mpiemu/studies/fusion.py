"""`mpiemu report fusion`: seed 002's fused GEMM epilogues and task granularity, GPT-2 MLP
and attention projections as StarPU tasks on 1-8 V100s (`devices/tasks.py`).

Each workload is tiled as NNTile tiles it (Algorithm 3: one GEMM task per output tile and
K-step; bias, activation and reshape tasks per tile) and run unfused or fused (the last
K-step's task carries bias + activation or the reshape, cuBLASLt-style epilogue, as the
report's FusedLinear). Kernel times come from the V100 preset's GEMM and memory-bound
kernel models; per-task runtime costs from StarPU's handbook. Costs only, seconds; the
golden test regenerates both CSVs. Setup and statements: `fusion.toml`.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from ..net import load_network
from ..devices.cost import GpuCost
from ..devices.gemm import NO_EPILOGUE, Epilogue
from ..devices.presets import load_device
from ..devices.tasks import Runtime, Task, run
from .common import Golden, Row, load_figures, write_csv

E_BYTES = 2          # fp16 tiles
RELU_FLOPS = 1


class Builder:
    """Tasks and tiles of one tiled workload on one device model."""

    def __init__(self, model: GpuCost, fused: bool) -> None:
        self.m, self.fused = model, fused
        self.tasks: list[Task] = []
        self.tiles: dict[str, float] = {}

    def tile(self, name: str, rows: int, cols: int) -> str:
        self.tiles.setdefault(name, rows * cols * E_BYTES)
        return name

    def gemm(self, name: str, m: int, n: int, k: int, reads: tuple[str, ...], out: str,
             epilogue: Epilogue | None = None) -> None:
        g = self.m.gemm(m, n, k, dtype="fp16", epilogue=epilogue or NO_EPILOGUE)
        kind = "fused" if epilogue else "gemm"
        self.tasks.append(Task(name, kind, g.time_s - g.launch_s, reads, out))

    def mem(self, name: str, kind: str, elems: int, reads: tuple[str, ...], out: str,
            passes: int = 2) -> None:
        t = self.m.elementwise_s(passes * elems * E_BYTES, elems * E_BYTES, elems,
                                 launch=False)
        self.tasks.append(Task(name, kind, t, reads, out))


def linear(b: Builder, x: list[str], rows: int, k_tiles: list[int], n_tiles: list[int],
           tag: str, epi: str) -> list[str]:
    """Y = act(X W + bias) tiled: X's tiles per K part, W per (K part, N part), bias per N
    part; `epi` is 'act' (bias + ReLU) or 'reshape' (bias + transpose)."""
    out = []
    for j, nj in enumerate(n_tiles):
        y = b.tile(f"{tag}.y{j}.{x[0]}", rows, nj)
        for kk, kt in enumerate(k_tiles):
            w = b.tile(f"{tag}.w{kk}.{j}", kt, nj)
            last = kk == len(k_tiles) - 1
            epilogue = Epilogue(out_flops=2, extra_read_bytes=nj * E_BYTES) \
                if b.fused and last else None
            reads = (x[kk], w) if kk == 0 else (x[kk], w, y)
            b.gemm(f"{tag}.gemm{j}.{kk}", rows, nj, kt, reads, y, epilogue)
        if not b.fused:
            bias = b.tile(f"{tag}.b{j}", 1, nj)
            b.mem(f"{tag}.bias{j}", "bias", rows * nj, (y, bias), y)
            b.mem(f"{tag}.{epi}{j}", epi, rows * nj, (y,), y, passes=1)
        out.append(y)
    return out


def _split(total: int, tile: int) -> list[int]:
    return [min(tile, total - i) for i in range(0, total, tile)]


def workload(model: GpuCost, kind: str, tokens: int, emb_tile: int, fused: bool,
             g: dict[str, int] | None = None) -> Builder:
    """GPT-2 MLP (FC-1 + bias + ReLU, FC-2 + bias) or attention projection (QKV + bias +
    reshape), every sequence tile of `tokens`, the inner / output dimension tiled."""
    fig = load_figures("fusion")
    g = g or fig["gpt2"].value
    st = int(g.get("seq_tile", fig["seq_tile"].value))
    b = Builder(model, fused)
    for s in range(math.ceil(tokens / st)):
        x = [b.tile(f"x{s}", st, g["embed"])]
        if kind == "mlp":
            inner = _split(g["inner"], emb_tile)
            h = linear(b, x, st, [g["embed"]], inner, f"fc1.s{s}", "act")
            linear(b, h, st, inner, [g["embed"]], f"fc2.s{s}", "act")
        else:
            linear(b, x, st, [g["embed"]], _split(3 * g["embed"], emb_tile), f"qkv.s{s}",
                   "reshape")
    return b


def runtime(spec_name: str) -> Runtime:
    fig = load_figures("fusion")
    spec = load_device(spec_name)
    peer = load_network(spec.network).intra          # GPU-to-GPU hop of its network
    return Runtime(submit_s=float(fig["starpu_submit_us"]) * 1e-6, launch_s=spec.kernel_launch_s,
                   host_bw_bytes_per_s=float(fig["host_link_GBps"]) * 1e9,
                   peer_bw_bytes_per_s=peer.bw_bytes_per_s,
                   link_latency_s=peer.latency("simple"))


def rows() -> list[Row]:
    fig = load_figures("fusion")
    dev = str(fig["device"].value)
    model, rt, thr = GpuCost(load_device(dev)), runtime(dev), float(fig["threshold_s"])
    out: list[Row] = []
    for kind in ("mlp", "attn"):
        for batch in fig["batches"].value:
            tokens = batch * fig["gpt2"].value["seq"]
            for tile in fig["emb_tiles"].value:
                for fused in (False, True):
                    w = workload(model, kind, tokens, tile, fused)
                    for n in fig["gpus"].value:
                        s = run(w.tasks, w.tiles, n, rt)
                        ex = [t.exec_s for t in w.tasks]
                        out.append({"workload": kind, "batch": batch, "emb_tile": tile,
                                    "fused": fused, "gpus": n, "tasks": len(w.tasks),
                                    "makespan_ms": s.makespan * 1e3,
                                    "tokens_per_s": tokens / s.makespan,
                                    "efficiency": s.efficiency,
                                    "mean_task_us": sum(ex) / len(ex) * 1e6,
                                    "tasks_below_threshold": sum(e < thr for e in ex) / len(ex)})
    big = fig["large"].value
    for fused in (False, True):
        w = workload(model, "mlp", big["batch"] * big["seq"], big["emb_tile"], fused, big)
        for n in fig["gpus"].value:
            s = run(w.tasks, w.tiles, n, rt)
            ex = [t.exec_s for t in w.tasks]
            out.append({"workload": "mlp-large", "batch": big["batch"],
                        "emb_tile": big["emb_tile"], "fused": fused, "gpus": n,
                        "tasks": len(w.tasks), "makespan_ms": s.makespan * 1e3,
                        "tokens_per_s": big["batch"] * big["seq"] / s.makespan,
                        "efficiency": s.efficiency, "mean_task_us": sum(ex) / len(ex) * 1e6,
                        "tasks_below_threshold": sum(e < thr for e in ex) / len(ex)})
    return out


GRAIN_US = (1, 3, 10, 30, 100, 300, 1000, 3000, 10000)


def granularity_rows() -> list[Row]:
    """Task Bench's trivial pattern: independent tasks of one length on 1-8 GPUs (64 per GPU,
    nothing to transfer): the efficiency the per-task costs leave, by task length."""
    fig = load_figures("fusion")
    rt = runtime(str(fig["device"].value))
    out: list[Row] = []
    for n in fig["gpus"].value:
        for us in GRAIN_US:
            tasks = [Task(f"t{i}", "trivial", us * 1e-6, (), f"o{i}") for i in range(64 * n)]
            s = run(tasks, {t.writes: 0.0 for t in tasks}, n, rt)
            out.append({"gpus": n, "task_us": us, "efficiency": round(s.efficiency, 4)})
    return out


def golden() -> list[Golden]:
    r = rows()
    from .fusion_report import statements  # noqa: PLC0415
    return [Golden("runs.csv", r), Golden("statements.csv", statements(r)),
            Golden("granularity.csv", granularity_rows())]


def main(out_dir: Path, argv: list[str]) -> int:
    from .fusion_report import markdown, plot, statements  # noqa: PLC0415
    ap = argparse.ArgumentParser(prog="mpiemu report fusion", description=__doc__)
    ap.add_argument("--out", type=Path, help="output directory")
    args = ap.parse_args(argv)
    out_dir = args.out or out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    r, g = rows(), granularity_rows()
    st = statements(r)
    write_csv(out_dir / "runs.csv", r)
    write_csv(out_dir / "statements.csv", st)
    write_csv(out_dir / "granularity.csv", g)
    plot(r, out_dir / "scaling.png")
    (out_dir / "README.md").write_text("\n".join(markdown(r, st, g)) + "\n")
    sys.stdout.write(f"wrote {out_dir}/README.md, runs.csv, statements.csv, granularity.csv, "
                     "scaling.png\n")
    return 0


__all__: list[Any] = ["main", "golden", "rows", "workload"]

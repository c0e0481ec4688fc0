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

import math
from typing import Any

from ..net import load_network
from ..devices.cost import GpuCost
from ..devices.gemm import NO_EPILOGUE, Epilogue
from ..devices.presets import load_device
from ..devices.tasks import Runtime, Task, run
from .common import Golden, Row, geomean, load_figures

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


def select(rows: list[Row], **kw: object) -> list[Row]:
    return [r for r in rows if all(r[k] == v for k, v in kw.items())]


def _ratio(rows: list[Row], **kw: object) -> float:
    """Geomean over GPU counts of unfused / fused makespan."""
    un = {r["gpus"]: r["makespan_ms"] for r in select(rows, fused=False, **kw)}
    fu = {r["gpus"]: r["makespan_ms"] for r in select(rows, fused=True, **kw)}
    return geomean(un[n] / fu[n] for n in un)


def statements(rows: list[Row]) -> list[Row]:
    """Seed 002's statements (V15-V19) with the number that decides each in our runs."""
    fig = load_figures("fusion")
    texts = fig["statements"].value
    small, big = min(fig["batches"].value), max(fig["batches"].value)
    gpus, tiles = fig["gpus"].value, fig["emb_tiles"].value
    mid = sorted(tiles)[len(tiles) // 2]
    r_small = _ratio(rows, workload="mlp", batch=small, emb_tile=mid)
    lg = fig["large"].value
    r_big = _ratio(rows, workload="mlp-large", batch=lg["batch"], emb_tile=lg["emb_tile"])
    one = {r["gpus"]: r["makespan_ms"] for r in select(rows, workload="mlp", batch=small,
                                                     emb_tile=mid, fused=False)}
    slower = max(one[n] / one[1] for n in gpus if n > 1)
    attn = geomean(_ratio(rows, workload="attn", batch=b, emb_tile=t)
                   for b in fig["batches"].value for t in tiles)
    fused_big = {r["gpus"]: r for r in select(rows, workload="mlp", batch=big, emb_tile=mid,
                                             fused=True)}
    scale = fused_big[max(gpus)]["tokens_per_s"] / fused_big[1]["tokens_per_s"]

    def ratio_at(n: int) -> float:
        u = select(rows, workload="mlp", batch=big, emb_tile=mid, fused=False, gpus=n)[0]
        return u["makespan_ms"] / fused_big[n]["makespan_ms"]

    best = {n: min(tiles, key=lambda t: select(rows, workload="mlp", batch=big, emb_tile=t,
                                             fused=True, gpus=n)[0]["makespan_ms"])
            for n in gpus}
    at = {t: geomean(select(rows, workload="mlp", batch=big, emb_tile=t, fused=True, gpus=n)[0]
                     ["makespan_ms"] for n in gpus) for t in tiles}
    checks = [
        (f"unfused / fused makespan, batch {small}, tile {mid} (geomean over GPUs)", r_small,
         r_small > 1.1),
        ("unfused / fused makespan, MLP with a ReLU task longer than the threshold "
         "(`large` in fusion.toml)", r_big, r_big < r_small and r_big < 1.1),
        (f"worst makespan on n > 1 GPUs / on 1 GPU, unfused, batch {small}", slower,
         slower > 1.0),
        ("unfused / fused makespan, attention projections (geomean over batches, tiles)", attn,
         attn > 1.0),
        (f"fused tokens/s on {max(gpus)} GPUs / on 1, batch {big}; fused speedup on "
         f"{max(gpus)} GPUs {ratio_at(max(gpus)):.2f}x vs {ratio_at(1):.2f}x on 1", scale,
         scale > 1.0 and ratio_at(max(gpus)) < ratio_at(1)),
        (f"fused makespan at tile {max(tiles)} / at {mid} (geomean over GPUs, batch {big}); "
         f"best tile per GPU count {best}", at[max(tiles)] / at[mid],
         at[max(tiles)] >= at[mid] and all(b == mid for b in best.values())),
    ]
    return [{"statement": s, "measure": m, "ours": round(v, 4), "holds": ok}
            for s, (m, v, ok) in zip(texts, checks)]


def golden() -> list[Golden]:
    r = rows()
    return [Golden("runs.csv", r), Golden("statements.csv", statements(r)),
            Golden("granularity.csv", granularity_rows())]


__all__: list[Any] = ["golden", "rows", "statements", "workload"]

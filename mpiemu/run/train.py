"""Workload kind "train": a GPT/BERT transformer trained TP x DP, real shards, emulated time.

Every rank runs the numpy math of its shard (or, with `run.numerics = "off"`, the same
schedule on shapes alone), moves real bytes on the TP and DP rings, and prints from rank 0
the loss, the emulated iteration time and where it went (compute / exposed TP communication
/ exposed DP communication, read back from its own trace). `train.check_reference` gathers
the shards to rank 0 and compares them with the one-process reference.
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict
from typing import Any

from mpi4py import MPI

from ..analysis.breakdown import IterationBreakdown, iteration_breakdown
from ..analysis.load import make_trace
from ..hw.presets import list_presets, load_device
from ..hw.specs import dtype_bytes
from ..nn.check import check_against_reference
from ..nn.config import ModelConfig, divisors
from ..nn.engine import Dims, Engine
from ..nn.memory import GIB, host_bytes, memory_report
from ..nn.model import ShardedModel, make_dims
from ..nn.optim import ShardedOptimizer
from ..nn.sunway_layer import SunwayLayerPlan
from ..overlap.api import STRATEGY_IMPLS
from ..sim.timeline import Timeline
from .config import Workload, resolve_device
from .context import RankContext
from .errors import ConfigError
from .overlap_check import check_overlap_devices

HOST_MEMORY_SHARE = 0.8    # a numerics run may use this share of the host's memory


def _fmt(xs: list[int]) -> str:
    return "{" + ", ".join(str(x) for x in xs) + "}"


def resolve(w: Workload) -> tuple[ModelConfig, int, Dims]:
    """The padded model, the global batch and this grid's local sizes (after validation)."""
    tp, dp = w.parallel.tp, w.parallel.dp
    cfg = w.model.resolve().for_tp(tp)
    gb = w.train.global_batch or w.model.preset_global_batch()
    return cfg, gb, make_dims(cfg, tp, dp, gb, w.parallel.sequence_parallel)


def validate(w: Workload, world_size: int) -> None:
    """Divisibility of the model by the grid, memory fit, strategy: before any message."""
    tp, dp, sp = w.parallel.tp, w.parallel.dp, w.parallel.sequence_parallel
    cfg = w.model.resolve()
    ok_tp = [t for t in divisors(cfg.heads) if cfg.ffn_hidden % t == 0]
    if cfg.heads % tp:
        raise ConfigError("parallel.tp", tp, f"does not divide model.heads={cfg.heads}; "
                          f"choose tp in {_fmt(ok_tp)}")
    if cfg.hidden % tp or cfg.ffn_hidden % tp:
        raise ConfigError("parallel.tp", tp, f"does not divide model.hidden={cfg.hidden} and "
                          f"model.ffn_hidden={cfg.ffn_hidden}; choose tp in {_fmt(ok_tp)}")
    if sp and cfg.seq_len % tp:
        raise ConfigError("model.seq_len", cfg.seq_len, f"is not divisible by parallel.tp={tp} "
                          "under parallel.sequence_parallel; choose tp in "
                          f"{_fmt([t for t in ok_tp if cfg.seq_len % t == 0])} or a seq_len "
                          f"that is a multiple of {tp}")
    gb = w.train.global_batch or w.model.preset_global_batch()
    if gb % dp:
        raise ConfigError("train.global_batch", gb, f"is not divisible by parallel.dp={dp}; "
                          f"choose dp in {_fmt(divisors(gb))} or a global batch that is a "
                          f"multiple of {dp}")
    if w.train.check_reference and w.run.numerics != "on":
        raise ConfigError("train.check_reference", True, "needs run.numerics='on' (real values)")
    if w.overlap.strategy not in STRATEGY_IMPLS:
        raise ConfigError("overlap.strategy", w.overlap.strategy, sorted(STRATEGY_IMPLS))
    _validate_sunway(w)
    _validate_kernels(w)
    _validate_update_unit(w)
    if resolve_device(w).kind == "gpu":
        check_overlap_devices(w, [w.overlap.strategy], "overlap.strategy")
    _validate_memory(w, world_size)


def _validate_sunway(w: Workload) -> None:
    """Sunway ranks: a matching preset, all-reduce TP (SWA 3.1) and no GPU overlap model."""
    spec = resolve_device(w)
    if spec.kind != "sunway":
        return
    w.sunway.check_device(spec.kind, spec.compute_units)
    if w.parallel.sequence_parallel:
        raise ConfigError("parallel.sequence_parallel", True, "Sunway ranks model Megatron TP "
                          "with all-reduces (SWattention / SwFormer); set it to false")
    if w.overlap.strategy != "sequential":
        raise ConfigError("overlap.strategy", w.overlap.strategy, "Sunway ranks run GEMM and "
                          "all-reduce in sequence (T3 is a GPU memory-system design); use "
                          "'sequential'")


def _validate_kernels(w: Workload) -> None:
    """Fused epilogues ride on the plain GEMM; the overlapped all-gather GEMM (SP) has none."""
    if w.train.fuse_epilogues and w.parallel.sequence_parallel and w.parallel.tp > 1:
        raise ConfigError("train.fuse_epilogues", True, "needs parallel.sequence_parallel="
                          "false (the all-gather -> GEMM of SP has no epilogue model)")
    if resolve_device(w).kind == "sunway" and (w.train.fuse_epilogues or
                                                w.model.resolve().attention in ("sd", "sdf")):
        raise ConfigError("model.attention" if not w.train.fuse_epilogues
                          else "train.fuse_epilogues", w.model.resolve().attention
                          if not w.train.fuse_epilogues else True,
                          "GPU kernels; Sunway ranks use [sunway] attention and scheduling")


def _validate_update_unit(w: Workload) -> None:
    """optimizer.on = "nmc" needs near-bank compute ([nmc]) on every rank's device."""
    if w.optimizer.on != "nmc":
        return
    for r in range(len(w.device.rank_presets) or 1):
        spec = resolve_device(w, r)
        if spec.nmc is None:
            have = [n for n in list_presets() if load_device(n).nmc is not None]
            raise ConfigError("optimizer.on", "nmc", f"needs near-bank compute: device "
                              f"{spec.name} has no [nmc] section (presets with one: "
                              f"{', '.join(have)})")


def _validate_memory(w: Workload, world_size: int) -> None:
    cfg, _, dims = resolve(w)
    spec = resolve_device(w)
    rep = memory_report(cfg, dims, dtype_bytes(w.run.emulated_dtype), spec.dram_capacity_bytes)
    if not rep.fits and w.train.memory_check == "error":
        raise ConfigError("model.preset", w.model.preset,
                          f"does not fit on {spec.name} at tp={w.parallel.tp}: {rep.line()} "
                          "per rank; raise parallel.tp, lower train.global_batch, set "
                          "parallel.sequence_parallel=true or model.attention='flash', or "
                          "train.memory_check='warn' to emulate it anyway")
    if w.run.numerics == "on":
        need = host_bytes(cfg, dims, 8 if w.run.numeric_dtype == "fp64" else 4) * world_size
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * HOST_MEMORY_SHARE
        if need > have:
            raise ConfigError("run.numerics", "on", f"needs ~{need / GIB:.1f} GiB of host "
                              f"memory for {world_size} ranks, this host has {have / GIB:.1f} "
                              "GiB to spare; use run.numerics='off' (timing only) or a "
                              "smaller model")


def run(ctx: RankContext) -> dict[str, Any]:
    """Train for run.iterations; rank 0 prints one line per iteration and the summary."""
    w, grid = ctx.w, ctx.grid
    cfg, gb, dims = resolve(w)
    eng = Engine(ctx.tl, ctx.model, ctx.tp, dtype=w.run.emulated_dtype, numerics=ctx.numerics,
                 overlap=w.overlap.to_overlap(), sp=dims.sp, kernels=w.train.kernel_options())
    if ctx.spec.kind == "sunway":     # layers charged as SwFormer CG schedules
        eng.sunway = SunwayLayerPlan.build(ctx.model, dims, w.run.emulated_dtype,  # type: ignore[arg-type]
                                           w.sunway.scheduler, w.sunway.attention)
    model = ShardedModel(cfg, eng, dims, tp_rank=grid.tp_rank, dp_rank=grid.dp_rank,
                         seed=w.run.seed, global_batch=gb, dp=ctx.dp,
                         bucket_bytes=w.train.dp_bucket_MiB * 2**20, np_dtype=ctx.np_dtype)
    opt = ShardedOptimizer(w.optimizer.to_config(), model.specs, eng, grid.tp_rank, model.P)
    mem = memory_report(cfg, dims, eng.e, ctx.spec.dram_capacity_bytes)
    _header(ctx, cfg, gb, dims, mem.line())
    rows: list[dict[str, Any]] = []
    t_run = time.perf_counter()
    for it in range(w.run.iterations):
        ctx.maybe_fail(it)
        ctx.writer.mark()
        wall0 = time.perf_counter()
        with ctx.tl.labelled(iteration=it):
            loss_share = model.train_step(it)
            with ctx.tl.labelled(phase="optim"):
                opt.step(model.P, model.G)
        ctx.writer.tick()
        loss = grid.dp_comm.allreduce(loss_share, op=MPI.SUM)   # reporting only, not emulated
        wall = ctx.world.allreduce(time.perf_counter() - wall0, op=MPI.MAX)
        rows.append(_report_iteration(ctx, it, loss, wall, _eta(t_run, it + 1,
                                                                 w.run.iterations)))
    summary: dict[str, Any] = {"model": cfg.name, "params": cfg.param_count(),
                               "global_batch": gb, "tp": grid.tp, "dp": grid.dp,
                               "sequence_parallel": dims.sp, "iterations": rows,
                               "memory": asdict(mem) | {"fits": mem.fits}}
    if w.overlap.strategy != "sequential":
        first = rows[0]
        summary["overlap"] = _against_sequential(ctx, cfg, gb, dims,
                                                 first["t_end"] - first["t_start"])
    if ctx.numerics:                # the estimate the run was admitted with, and the truth
        import resource  # noqa: PLC0415
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        summary["host_memory"] = {
            "estimate_bytes": host_bytes(cfg, dims, 8 if w.run.numeric_dtype == "fp64" else 4),
            "peak_bytes": ctx.world.gather(peak, root=0)}
    if w.train.check_reference and ctx.numerics:
        chk = check_against_reference(ctx.world, cfg, w.optimizer.to_config(), w.run.seed, gb,
                                      grid.tp, grid.tp_rank, model.P,  # type: ignore[arg-type]
                                      [r["loss"] for r in rows], ctx.np_dtype,
                                      reference_tolerance(w))
        ctx.say(chk.line())
        summary["reference"] = chk.as_dict()
    return summary


def _sequential_iteration_s(ctx: RankContext, cfg: ModelConfig, gb: int, dims: Dims) -> float:
    """Iteration 0 again on a scratch clock, timing only, every TP pair `sequential`.

    Its messages travel on duplicate communicators, so they never meet the run's own.
    """
    w, grid = ctx.w, ctx.grid
    tl = Timeline()
    tp = ctx.tp.sibling(grid.tp_comm.Dup(), "tp", tl)
    dp = ctx.tp.sibling(grid.dp_comm.Dup(), "dp", tl)
    eng = Engine(tl, ctx.model, tp, dtype=w.run.emulated_dtype, numerics=False,
                 overlap=w.overlap.to_overlap(strategy="sequential"), sp=dims.sp,
                 kernels=w.train.kernel_options())
    model = ShardedModel(cfg, eng, dims, tp_rank=grid.tp_rank, dp_rank=grid.dp_rank,
                         seed=w.run.seed, global_batch=gb, dp=dp,
                         bucket_bytes=w.train.dp_bucket_MiB * 2**20, np_dtype=ctx.np_dtype)
    opt = ShardedOptimizer(w.optimizer.to_config(), model.specs, eng, grid.tp_rank, model.P)
    with tl.labelled(iteration=0):
        model.train_step(0)
        opt.step(model.P, model.G)
    for c in (tp.comm, dp.comm):
        c.Free()
    return tl.now()


def _against_sequential(ctx: RankContext, cfg: ModelConfig, gb: int, dims: Dims,
                        iteration_s: float) -> dict[str, float]:
    """Issue-4 item 6: the iteration speedup of the run's strategy over `sequential`."""
    base = ctx.world.bcast(_sequential_iteration_s(ctx, cfg, gb, dims), root=0)
    speedup = base / iteration_s
    ctx.say(f"overlap {ctx.w.overlap.strategy}: iteration 0 {iteration_s * 1e3:.4f} ms, "
            f"sequential {base * 1e3:.4f} ms: speedup {speedup:.4f}x "
            f"({(speedup - 1) * 100:+.2f}%)")
    return {"iteration_s": iteration_s, "sequential_s": base, "speedup": speedup}


def _header(ctx: RankContext, cfg: ModelConfig, gb: int, dims: Dims, mem: str) -> None:
    w = ctx.w
    ctx.say(f"train {cfg.name}: {cfg.param_count() / 1e6:.4g}M params, {cfg.layers} layers, "
            f"H={cfg.hidden}, heads={cfg.heads}, seq={cfg.seq_len}, global batch {gb}; "
            f"tp={ctx.grid.tp} x dp={ctx.grid.dp}{' + SP' if dims.sp else ''} on "
            f"{ctx.spec.name}, {w.run.emulated_dtype} emulated, numerics "
            f"{w.run.numerics}{' (' + w.run.numeric_dtype + ')' if ctx.numerics else ''}, "
            f"{w.optimizer.name}, overlap {w.overlap.strategy}"
            + (f", Sunway {w.sunway.mode} {w.sunway.attention} scheduler {w.sunway.scheduler}"
               if ctx.spec.kind == "sunway" else ""),
            f"memory per rank: {mem}",
            f"{'iter':>4} {'loss':>10} {'iteration ms':>13} {'compute ms':>11} "
            f"{'TP comm ms':>11} {'DP comm ms':>11} {'DP total ms':>12} {'idle ms':>9} "
            f"{'wall s':>8}   progress (rank 0; comm = exposed)")


def _eta(t_run: float, done: int, total: int) -> str:
    """Progress: i / N and the wall time left at the pace so far."""
    left = (time.perf_counter() - t_run) / done * (total - done)
    return f"{done}/{total} eta {left:.0f}s" if done < total else f"{done}/{total} done"


def _report_iteration(ctx: RankContext, it: int, loss: float, wall: float,
                      progress: str) -> dict[str, Any]:
    """Rank 0's breakdown of what this iteration committed to its trace (the same code as
    `analyze`, on the writer's blocks in memory: the cost per iteration stays flat)."""
    b: IterationBreakdown | None = None
    if ctx.rank == 0:
        events, strings = ctx.writer.since_mark()
        b = iteration_breakdown(make_trace({"rank": 0}, events, strings), it)
    b = ctx.world.bcast(b, root=0)
    ms = 1e3
    loss_txt = f"{loss:>10.5f}" if ctx.numerics else f"{'-':>10}"
    ctx.say(f"{it:>4} {loss_txt} {b.iteration_s * ms:>13.4f} {b.compute_s * ms:>11.4f} "
            f"{b.tp_exposed_s * ms:>11.4f} {b.dp_exposed_s * ms:>11.4f} "
            f"{b.dp_total_s * ms:>12.4f} {b.idle_s * ms:>9.4f} {wall:>8.2f}   {progress}")
    return {"loss": loss if ctx.numerics else None, "wall_s": wall} | asdict(b)


def reference_tolerance(w: Workload) -> float:
    """The check's relative tolerance: given, or by the numeric dtype.

    fp32: Adam / LAMB normalize gradients, so a gradient that is pure rounding noise (the key
    bias: softmax is shift invariant) still moves its weight by up to lr; those moves differ
    between orders of summation at ~1e-4 of the fused QKV bias' scale.
    """
    if w.train.reference_rtol:
        return w.train.reference_rtol
    return 1e-10 if w.run.numeric_dtype == "fp64" else 1e-3


"""Workload kind "train": a GPT/BERT transformer trained TP x DP, real shards, emulated time.

Every rank runs the numpy math of its shard (or, with `run.numerics = "off"`, the same
schedule on shapes alone), moves real bytes on the TP and DP rings, and prints from rank 0
the loss, the emulated iteration time and where it went (compute / exposed TP communication
/ exposed DP communication, read back from its own trace). `train.check_reference` gathers
the shards to rank 0 and compares them with the one-process reference.
"""
from __future__ import annotations

import hashlib
import os
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from mpi4py import MPI

from ..analysis.breakdown import IterationBreakdown, iteration_breakdown
from ..analysis.load import make_trace
from ..hw.presets import list_presets, load_device
from ..hw.specs import dtype_bytes
from ..nn.check import check_against_reference
from ..nn.config import ModelConfig, divisors
from ..nn.engine import Dims, Engine
from ..nn.memory import GIB, Layout, MemoryReport, host_bytes, memory_report
from ..comm.p2p import TimedComm
from ..nn.flops import hardware_flops, model_flops, utilization
from ..nn.model import ShardedModel, make_dims
from ..nn.optim import ShardedOptimizer
from ..nn.sunway_layer import SunwayEngine, SunwayLayerPlan
from ..pipeline.step import PipelineStep
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
    """The padded model, the global batch and one micro-batch's local sizes."""
    tp, dp = w.parallel.tp, w.parallel.dp
    cfg = w.model.resolve().for_tp(tp)
    gb = w.train.global_batch or w.model.preset_global_batch()
    mb = w.train.micro_batch or max(gb // dp, 1)
    return cfg, gb, make_dims(cfg, tp, mb, w.parallel.sequence_parallel)


def micro_batches(w: Workload) -> int:
    """Micro-batches per DP rank per step: global batch / (micro-batch x DP)."""
    _, gb, dims = resolve(w)
    return max(gb // (w.parallel.dp * dims.batch), 1)


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
    _validate_pipeline(w, cfg.layers, gb)
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


def _validate_pipeline(w: Workload, layers: int, gb: int) -> None:
    """Stages split the layers evenly; micro-batches split each DP rank's batch; the
    interleaved schedule runs micro-batches in groups of pp (Megatron-LM's requirement)."""
    par, mb = w.parallel, w.train.micro_batch
    pp, v = par.pp, par.virtual_stages
    if layers % pp:
        raise ConfigError("parallel.pp", pp, f"does not divide model.layers={layers}; "
                          f"choose pp in {_fmt(divisors(layers))}")
    if layers % (pp * v):
        ok = [x for x in divisors(layers // pp) if x > 1]
        raise ConfigError("parallel.virtual_stages", v, f"pp x virtual_stages = {pp * v} "
                          f"does not divide model.layers={layers}; " +
                          (f"choose virtual_stages in {_fmt(ok)}" if ok else
                           f"{layers // pp} layer(s) per stage cannot be split; use "
                           "parallel.schedule='1f1b'"))
    per_dp = gb // par.dp
    if mb and per_dp % mb:
        raise ConfigError("train.micro_batch", mb, f"does not divide the {per_dp} sequences "
                          f"of each DP rank (global batch {gb} / dp {par.dp}); choose one of "
                          f"{_fmt(divisors(per_dp))}")
    m = per_dp // (mb or per_dp)
    if par.schedule == "interleaved" and (m % pp or m < pp):
        ok = [b for b in divisors(per_dp) if (per_dp // b) % pp == 0]
        raise ConfigError("train.micro_batch", mb, f"gives {m} micro-batches per DP rank; the "
                          f"interleaved schedule needs a multiple of parallel.pp={pp}; choose "
                          f"micro_batch in {_fmt(ok)}")
    if resolve_device(w).kind == "sunway" and w.train.recompute == "selective":
        raise ConfigError("train.recompute", "selective", "Sunway ranks charge a layer as one "
                          "CG schedule; use 'none' or 'full'")


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


def layout(w: Workload, stage: int) -> Layout:
    """The memory-relevant placement and step of a rank of pipeline stage `stage`."""
    par = w.parallel
    return Layout(pp=par.pp, stage=stage, chunks=par.virtual_stages, schedule=par.schedule,
                  micro_batches=micro_batches(w), recompute=w.train.recompute, dp=par.dp,
                  distributed=w.optimizer.distributed)


def train_memory(w: Workload, capacity_bytes: float, stage: int) -> MemoryReport:
    cfg, _, dims = resolve(w)
    return memory_report(cfg, dims, dtype_bytes(w.run.emulated_dtype), capacity_bytes,
                         layout(w, stage))


def _validate_memory(w: Workload, world_size: int) -> None:
    cfg, _, dims = resolve(w)
    spec = resolve_device(w)
    reps = [train_memory(w, spec.dram_capacity_bytes, s) for s in range(w.parallel.pp)]
    stage = max(range(len(reps)), key=lambda s: reps[s].total_bytes)
    if not reps[stage].fits and w.train.memory_check == "error":
        where = f" (pipeline stage {stage}, the fullest)" if w.parallel.pp > 1 else ""
        raise ConfigError("model.preset", w.model.preset,
                          f"does not fit on {spec.name} at tp={w.parallel.tp}, "
                          f"pp={w.parallel.pp}: {reps[stage].line()} per rank{where}; raise "
                          "parallel.tp or parallel.pp, lower train.micro_batch, set "
                          "parallel.sequence_parallel=true, train.recompute, "
                          "optimizer.distributed=true or model.attention='flash', or "
                          "train.memory_check='warn' to emulate it anyway")
    if w.run.numerics == "on":
        item = 8 if w.run.numeric_dtype == "fp64" else 4
        per_stage = [host_bytes(cfg, dims, item, layout(w, s)) for s in range(w.parallel.pp)]
        need = sum(per_stage) * world_size / w.parallel.pp
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * HOST_MEMORY_SHARE
        if need > have:
            raise ConfigError("run.numerics", "on", f"needs ~{need / GIB:.1f} GiB of host "
                              f"memory for {world_size} ranks, this host has {have / GIB:.1f} "
                              "GiB to spare; use run.numerics='off' (timing only) or a "
                              "smaller model")


@dataclass
class Trainer:
    """One rank's model stage, its pipeline step and its optimizer."""

    model: ShardedModel
    step: PipelineStep
    opt: ShardedOptimizer
    comms: list[TimedComm]          # the duplicates a scratch trainer made (freed by it)

    def train_step(self, it: int) -> float:
        """Forward, backward and update of iteration `it`; this rank's loss share."""
        share = self.step.run(it)
        with self.model.E.tl.labelled(phase="optim"):
            self.opt.step(self.model.P, self.model.G)
        return share

    def free(self) -> None:
        for tc in self.comms:
            tc.comm.Free()


def build(ctx: RankContext, tl: Timeline, *, numerics: bool, strategy: str = "",
          scratch: bool = False) -> Trainer:
    """The rank's trainer on timeline `tl`; `scratch`: on duplicate communicators, so its
    messages never meet the run's own (a second, timing-only run beside it)."""
    w, grid = ctx.w, ctx.grid
    cfg, gb, dims = resolve(w)
    made: list[TimedComm] = []

    def comm(c: Any, name: str) -> TimedComm | None:
        if c == MPI.COMM_NULL:
            return None
        tc = ctx.tp.sibling(c.Dup() if scratch else c, name, tl)
        if scratch:
            made.append(tc)
        return tc

    tp, dp = comm(grid.tp_comm, "tp"), comm(grid.dp_comm, "dp")
    pp = comm(grid.pp_comm, "pp") if grid.pp > 1 else None
    embed = comm(grid.embed_comm, "embed") if grid.pp > 1 else None
    distributed = w.optimizer.distributed and grid.dp > 1
    mp = comm(ctx.world if distributed else grid.mp_comm, "world" if distributed else "mp")
    assert tp is not None and dp is not None and mp is not None
    cls = SunwayEngine if ctx.spec.kind == "sunway" else Engine
    eng = cls(tl, ctx.model, tp, dtype=w.run.emulated_dtype, numerics=numerics,
              overlap=w.overlap.to_overlap(strategy or None),
              sp=dims.sp, kernels=w.train.kernel_options(), tp_async=w.train.tp_comm_async and cls is Engine)
    if isinstance(eng, SunwayEngine):     # layers charged as SwFormer CG schedules
        eng.plan = SunwayLayerPlan.build(ctx.model, dims, w.run.emulated_dtype,  # type: ignore[arg-type]
                                         w.sunway.scheduler, w.sunway.attention)
    m = micro_batches(w)
    opt_cfg = w.optimizer.to_config()
    model = ShardedModel(cfg, eng, dims, tp_rank=grid.tp_rank, dp_rank=grid.dp_rank,
                         seed=w.run.seed, global_batch=gb, dp=dp,
                         bucket_bytes=w.train.dp_bucket_MiB * 2**20, np_dtype=ctx.np_dtype,
                         pp=grid.pp, pp_rank=grid.pp_rank, chunks=w.parallel.virtual_stages,
                         micro_batches=m, recompute=w.train.recompute, embed=embed,
                         shard_grads=opt_cfg.distributed,
                         overlap_grad_reduce=w.train.overlap_grad_reduce)
    step = PipelineStep(model, pp, w.parallel.schedule, m, ctx.np_dtype)
    opt = ShardedOptimizer(opt_cfg, model.specs, eng, grid.tp_rank, model.P, norm=mp,
                           counted=lambda lp: (lp.tp_split or grid.tp_rank == 0)
                           and not (lp.name == "wte" and grid.pp_rank > 0),
                           buckets=model.buckets)
    if opt.zero is not None:       # forwards wait for their layers' parameter gathers
        model.param_ready = opt.zero.param_ready
    return Trainer(model, step, opt, made)


def run(ctx: RankContext) -> dict[str, Any]:
    """Train for run.iterations; rank 0 prints one line per iteration and the summary."""
    w, grid = ctx.w, ctx.grid
    cfg, gb, dims = resolve(w)
    trainer = build(ctx, ctx.tl, numerics=ctx.numerics)
    model = trainer.model
    mem = train_memory(w, ctx.spec.dram_capacity_bytes, grid.pp_rank)
    _header(ctx, cfg, gb, dims, mem.line())
    rows: list[dict[str, Any]] = []
    t_run = time.perf_counter()
    reports_loss = grid.last_stage and grid.tp_rank == 0
    for it in range(w.run.iterations):
        ctx.maybe_fail(it)
        ctx.writer.mark()
        wall0 = time.perf_counter()
        with ctx.tl.labelled(iteration=it):
            share = trainer.train_step(it)
        ctx.writer.tick()
        loss = ctx.world.allreduce(share if reports_loss else 0.0, op=MPI.SUM)  # reporting
        wall = ctx.world.allreduce(time.perf_counter() - wall0, op=MPI.MAX)
        rows.append(_report_iteration(ctx, it, loss, wall, _eta(t_run, it + 1,
                                                                 w.run.iterations)))
    summary: dict[str, Any] = {"model": cfg.name, "params": cfg.param_count(),
                               "global_batch": gb, "tp": grid.tp, "dp": grid.dp,
                               "pp": grid.pp, "micro_batch": dims.batch,
                               "micro_batches": micro_batches(w),
                               "schedule": w.parallel.schedule,
                               "virtual_stages": w.parallel.virtual_stages,
                               "recompute": w.train.recompute,
                               "sequence_parallel": dims.sp, "iterations": rows,
                               "flops": {"model": model_flops(cfg, gb),
                                         "hardware": hardware_flops(cfg, gb,
                                                                    w.train.recompute),
                                         "devices": ctx.world.Get_size(),
                                         "peak_flops_per_s": ctx.spec.peak(
                                             w.run.emulated_dtype)},
                               "memory": asdict(mem) | {"fits": mem.fits,
                                                        "total_bytes": mem.total_bytes}}
    if w.overlap.strategy != "sequential":
        first = rows[0]
        summary["overlap"] = _against_sequential(ctx, first["t_end"] - first["t_start"])
    if ctx.numerics:                # the estimate the run was admitted with, and the truth
        import resource  # noqa: PLC0415
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        summary["host_memory"] = {
            "estimate_bytes": host_bytes(cfg, dims, 8 if w.run.numeric_dtype == "fp64" else 4,
                                         layout(w, grid.pp_rank)),
            "peak_bytes": ctx.world.gather(peak, root=0)}
    held = ctx.world.allgather((grid.pp_rank, model.peak_saved))
    summary["in_flight"] = {str(stage): n for stage, n in sorted(set(held))}
    if ctx.numerics:                # bit-level identity of every rank's parameters
        summary["params_sha256"] = ctx.world.gather(params_digest(model.P), root=0)
    if w.train.check_reference and ctx.numerics:
        chk = check_against_reference(ctx.world, cfg, w.optimizer.to_config(), w.run.seed, gb,
                                      grid.tp, grid.tp_rank, model.P,  # type: ignore[arg-type]
                                      [r["loss"] for r in rows], ctx.np_dtype,
                                      reference_tolerance(w))
        ctx.say(chk.line())
        summary["reference"] = chk.as_dict()
    return summary


def params_digest(P: dict[str, Any]) -> str:
    """SHA-256 over a rank's parameter tensors (sorted by name): equal digests mean
    bit-identical parameters."""
    h = hashlib.sha256()
    for name in sorted(P):
        h.update(name.encode())
        h.update(np.ascontiguousarray(P[name]).tobytes())
    return h.hexdigest()


def _sequential_iteration_s(ctx: RankContext) -> float:
    """Iteration 0 again on a scratch clock, timing only, every TP pair `sequential`."""
    tl = Timeline()
    trainer = build(ctx, tl, numerics=False, strategy="sequential", scratch=True)
    with tl.labelled(iteration=0):
        trainer.train_step(0)
    trainer.free()
    return tl.now()


def _against_sequential(ctx: RankContext, iteration_s: float) -> dict[str, float]:
    """Issue-4 item 6: the iteration speedup of the run's strategy over `sequential`."""
    base = ctx.world.bcast(_sequential_iteration_s(ctx), root=0)
    speedup = base / iteration_s
    ctx.say(f"overlap {ctx.w.overlap.strategy}: iteration 0 {iteration_s * 1e3:.4f} ms, "
            f"sequential {base * 1e3:.4f} ms: speedup {speedup:.4f}x "
            f"({(speedup - 1) * 100:+.2f}%)")
    return {"iteration_s": iteration_s, "sequential_s": base, "speedup": speedup}


def _header(ctx: RankContext, cfg: ModelConfig, gb: int, dims: Dims, mem: str) -> None:
    w = ctx.w
    ctx.say(f"train {cfg.name}: {cfg.param_count() / 1e6:.4g}M params, {cfg.layers} layers, "
            f"H={cfg.hidden}, heads={cfg.heads}, seq={cfg.seq_len}, global batch {gb}; "
            f"tp={ctx.grid.tp} x dp={ctx.grid.dp} x pp={ctx.grid.pp}{' + SP' if dims.sp else ''}"
            f" ({_pipeline_words(w)}) on "
            f"{ctx.spec.name}, {w.run.emulated_dtype} emulated, numerics "
            f"{w.run.numerics}{' (' + w.run.numeric_dtype + ')' if ctx.numerics else ''}, "
            f"{w.optimizer.name}{' (distributed)' if w.optimizer.distributed else ''}, "
            f"overlap {w.overlap.strategy}"
            + (f", Sunway {w.sunway.mode} {w.sunway.attention} scheduler {w.sunway.scheduler}"
               if ctx.spec.kind == "sunway" else ""),
            f"memory per rank{' of stage 0' if ctx.grid.pp > 1 else ''}: {mem}",
            f"{'iter':>4} {'loss':>10} {'iteration ms':>13} {'compute ms':>11} "
            f"{'TP comm ms':>11} {'DP comm ms':>11} {'DP total ms':>12} {'idle ms':>9} "
            f"{'MFU %':>6} {'wall s':>8}   progress (rank 0; comm = exposed)")


def _pipeline_words(w: Workload) -> str:
    m, par = micro_batches(w), w.parallel
    words = f"{m} micro-batch{'es' if m > 1 else ''} of {resolve(w)[2].batch}"
    if par.pp > 1:
        words += f", {par.schedule}" + (f" x{par.virtual_stages}" if par.virtual_stages > 1
                                         else "")
    return words + (f", recompute {w.train.recompute}" if w.train.recompute != "none" else "")


def _eta(t_run: float, done: int, total: int) -> str:
    """Progress: i / N and the wall time left at the pace so far."""
    left = (time.perf_counter() - t_run) / done * (total - done)
    return f"{done}/{total} eta {left:.0f}s" if done < total else f"{done}/{total} done"


def _report_iteration(ctx: RankContext, it: int, loss: float, wall: float,
                      progress: str) -> dict[str, Any]:
    """The breakdown of what this iteration committed to every rank's trace (the same code
    as `analyze`, on the writer's blocks in memory: the cost per iteration stays flat);
    rank 0 prints its own, with MFU and HFU, and keeps each pipeline stage's."""
    events, strings = ctx.writer.since_mark()
    rt = make_trace({"rank": ctx.rank}, events, strings)
    b = ctx.world.bcast(iteration_breakdown(rt, it) if ctx.rank == 0 else None, root=0)
    mine = iteration_breakdown(rt, it, (b.t_start, b.t_end), sync_is_idle=True)
    every = ctx.world.allgather((ctx.grid.pp_rank, mine))
    cfg, gb, _ = resolve(ctx.w)
    peak = ctx.spec.peak(ctx.w.run.emulated_dtype)
    mfu = utilization(model_flops(cfg, gb), b.iteration_s, ctx.world.Get_size(), peak)
    hfu = utilization(hardware_flops(cfg, gb, ctx.w.train.recompute), b.iteration_s,
                      ctx.world.Get_size(), peak)
    stages: dict[int, IterationBreakdown] = {}
    for stage, br in every:
        stages.setdefault(stage, br)
    ms = 1e3
    loss_txt = f"{loss:>10.5f}" if ctx.numerics else f"{'-':>10}"
    ctx.say(f"{it:>4} {loss_txt} {b.iteration_s * ms:>13.4f} {b.compute_s * ms:>11.4f} "
            f"{b.tp_exposed_s * ms:>11.4f} {b.dp_exposed_s * ms:>11.4f} "
            f"{b.dp_total_s * ms:>12.4f} {b.idle_s * ms:>9.4f} {mfu * 100:>6.2f} "
            f"{wall:>8.2f}   {progress}")
    return {"loss": loss if ctx.numerics else None, "wall_s": wall, "mfu": mfu,
            "hfu": hfu, "stages": [_stage_row(k, v, b.iteration_s)
                                   for k, v in sorted(stages.items())]} | asdict(b)


def _stage_row(stage: int, br: IterationBreakdown, iteration_s: float) -> dict[str, Any]:
    """One pipeline stage in the step's window: its bubble is the time it does nothing,
    neither compute nor communication of its own (waiting for its neighbours)."""
    return {"stage": stage, "bubble_s": br.idle_s, "bubble_fraction": br.idle_s / iteration_s,
            "recompute_s": br.recompute_s, "compute_s": br.compute_s,
            "tp_exposed_s": br.tp_exposed_s, "dp_exposed_s": br.dp_exposed_s}


def reference_tolerance(w: Workload) -> float:
    """The check's relative tolerance: given, or by the numeric dtype.

    fp32: Adam / LAMB normalize gradients, so a gradient that is pure rounding noise (the key
    bias: softmax is shift invariant) still moves its weight by up to lr; those moves differ
    between orders of summation at ~1e-4 of the fused QKV bias' scale.
    """
    if w.train.reference_rtol:
        return w.train.reference_rtol
    return 1e-10 if w.run.numeric_dtype == "fp64" else 1e-3


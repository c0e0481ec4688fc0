"""Workload kind "train": a GPT/BERT transformer trained TP x DP x PP, real shards, emulated
time (its configuration checks: `train_setup`).

Every rank runs the numpy math of its shard (or, with `run.numerics = "off"`, the same
schedule on shapes alone), moves real bytes on the TP, DP and PP groups, and prints from rank 0
the loss, the emulated iteration time and where it went (compute / exposed TP communication
/ exposed DP communication, read back from its own trace). `train.check_reference` gathers
the shards to rank 0 and compares them with the one-process reference.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Iterator

import numpy as np
from mpi4py import MPI

from .._digest import sha256
from ..analysis.breakdown import (BREAKDOWN_FIELDS, IterationBreakdown, counted,
                                  iteration_breakdown, window_of)
from ..analysis.rank_trace import make_trace
from ..comm.p2p import TimedComm
from ..precision.loss_scale import overflow_expected
from ..precision.fp8_gemm import Fp8Gemm
from ..precision.matmul import PrecisionGemm
from ..executors.registry import ExecutorSetup, make_executor
from ..model.config import ModelConfig
from ..model.dims import Dims
from ..comm.grid import ProcessGrid
from .fold_plan import describe
from ..model.moe.routing_trace import FILE as ROUTING
from ..model.moe.routing_trace import write as write_routing
from ..model.moe.state import MoeRun
from ..model.stage import StageModel
from ..model.tensor_parallel import LocalParam
from ..training.check import judges_gradients
from .heartbeat import Heartbeat
from .train_check import drift_log, reference_summary
from ..training.flops import hardware_flops, model_flops, utilization
from ..training.gradients import StageGradients
from ..training.memory import host_bytes
from ..training.optimizer import ShardedOptimizer
from ..training.pipeline_step import PipelineStep
from ..sim.timeline import Timeline
from ..config.workload import Workload
from .context import RankContext
from .mpi import arrive
from .moe_setup import routing_trace
from .train_setup import (grad_buffer, layout, micro_batches, reference_tolerance, resolve,
                          train_memory, validate)

__all__ = ["build", "reference_tolerance", "resolve", "run", "validate"]   # the kind's API

@dataclass
class Trainer:
    """One rank's model stage, its gradients, its pipeline step and its optimizer."""

    model: StageModel
    grads: StageGradients
    step: PipelineStep
    opt: ShardedOptimizer
    comms: list[TimedComm]          # the duplicates a scratch trainer made (freed by it)
    # iteration 0's reduced gradients, kept for the reference check (`keep_first_grads`)
    first_grads: dict[str, np.ndarray] | None = None
    first_grads_iteration: int = 0
    keep_first_grads: bool = False
    taken: bool = True              # the last step updated the weights (FP16: not skipped)
    fp8: Fp8Gemm | None = None      # the layers' FP8 GEMMs (numerics on, an [fp8] recipe)

    def train_step(self, it: int) -> float:
        """Forward, backward and update of iteration `it`; this rank's loss share."""
        scaler = self.opt.scaler
        self.model.loss_scale = 1.0 if scaler is None else scaler.scale    # FP16
        if self.fp8 is not None:                # the first micro-batch casts the weights
            self.fp8.new_step()
        with overflow_expected(scaler is not None):
            share = self.step.run(it)
        grads = None
        if self.keep_first_grads and self.first_grads is None:   # host-side, outside time
            grads = {k: g / self.model.loss_scale for k, g in self.grads.reduced().items()}
        with self.model.E.labelled(phase="optim"):
            self.taken = self.opt.step(self.model.P, self.model.G)
        if grads is not None and self.taken:    # FP16: the first step not skipped (the
            self.first_grads, self.first_grads_iteration = grads, it   # others overflowed)
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

    tp, pp = comm(grid.tp_comm, "tp"), comm(grid.pp_comm, "pp") if grid.pp > 1 else None
    cp = comm(grid.cp_comm, "cp") if grid.cp > 1 else None
    # gradients are reduced (and the distributed optimizer sharded) over DP x CP
    dp = comm(grid.dp_cp_comm, "dp") if grid.cp > 1 else comm(grid.dp_comm, "dp")
    embed = comm(grid.embed_comm, "embed") if grid.pp > 1 else None
    ep = comm(grid.ep_comm, "ep") if grid.shape.ep > 1 else None
    etp = comm(grid.etp_comm, "etp") if grid.shape.etp > 1 else None
    etp_ep = comm(grid.etp_ep_comm, "etp_ep") if grid.shape.etp > 1 else None
    # the experts' gradients: over expert DP (the stage's ranks sharing them), when that is
    # not DP x CP (EP, or TP ranks routing their own sequence shards)
    edp = comm(grid.edp_comm, "edp") if cfg.moe is not None and \
        grid.edp_comm is not grid.dp_cp_comm else None
    # the gradient norm sums every element once: over TP x PP, or the world when the
    # optimizer is sharded or experts are split over EP (each counted on one rank)
    distributed = (w.optimizer.distributed and grid.dp * grid.cp > 1) or edp is not None
    mp = comm(grid.world_comm if distributed else grid.mp_comm, "world" if distributed else "mp")
    assert tp is not None and dp is not None and mp is not None
    buf = grad_buffer(w, ctx.spec.kind)
    fp8 = fp8_gemm(w, grid.amax_comm) if numerics and w.fp8.on else None
    overlap = w.overlap.to_overlap(strategy or None)
    ex = make_executor(ctx.spec.kind, ExecutorSetup(
        tl, ctx.cost, tp, dims, w.run.emulated_dtype, numerics, overlap,
        kernels=w.train.kernel_options(), tp_async=w.train.tp_comm_async,
        wgrad_epilogue=None if buf is None else buf.wgrad_epilogue, cp=cp, ep=ep,
        etp=etp, etp_ep=etp_ep, sunway_scheduler=w.sunway.scheduler,
        sunway_attention=w.sunway.attention,
        precision=PrecisionGemm(w.run.numeric_dtype), fp8=w.fp8.recipe, fp8_gemm=fp8,
        fp8_params=w.optimizer.fp8_param_gather))
    m = micro_batches(w)
    opt_cfg = w.optimizer.to_config()
    model = StageModel(cfg, ex, dims, tp_rank=grid.tp_rank, dp_rank=grid.dp_rank,
                       seed=w.run.seed, global_batch=gb, np_dtype=ctx.np_dtype, pp=grid.pp,
                       pp_rank=grid.pp_rank, chunks=w.parallel.virtual_stages,
                       micro_batches=m, recompute=w.train.recompute, cp_rank=grid.cp_rank,
                       cp_comm=w.parallel.cp_comm, split=w.parallel.split,
                       moe=None if cfg.moe is None else MoeRun(
                           cfg.moe, w.moe.source(numerics), w.moe.dispatcher,
                           w.moe.shared_overlap, w.moe.skew,
                           w.run.seed, gb,
                           trace=routing_trace(w, cfg)))
    grads = StageGradients(model, ex, dp, grad_buffer=buf,
                           bucket_bytes=w.train.dp_bucket_MiB * 2**20,
                           bidirectional=overlap.bidirectional, embed=embed,
                           zero=opt_cfg.zero, overlap_grad_reduce=w.train.overlap_grad_reduce,
                           ddp=w.train.ddp, prefetch=opt_cfg.prefetch,
                           reshard_after_forward=opt_cfg.reshard_after_forward,
                           shard_group=opt_cfg.shard_group, experts=edp,
                           fp8_param_gather=opt_cfg.fp8_param_gather)
    step = PipelineStep(model, grads, pp, w.parallel.schedule, m, ctx.np_dtype,
                        combined=w.moe.overlap_ep_comm)
    opt = ShardedOptimizer(opt_cfg, model.specs, ex, grid.tp_rank, model.P, norm=mp,
                           counted=lambda lp: counted_once(grid, lp, edp is not None,
                                                           opt_cfg.zero >= 1),
                           buckets=grads.buckets, params=grads.params,
                           expert_buckets=grads.expert_buckets,
                           expert_params=grads.expert_params,
                           scaler=opt_cfg.loss_scaler() if numerics and
                           w.run.numeric_dtype == "fp16" else None)
    if opt.zero is not None:       # forwards wait for their layers' parameter gathers
        grads.param_ready = opt.zero.param_ready
    return Trainer(model, grads, step, opt, made, fp8=fp8)


def fp8_gemm(w: Workload, amax_comm: Any) -> Fp8Gemm:
    """The layers' GEMMs under the [fp8] recipe, amaxes MAX-reduced over `amax_comm`."""
    recipe = w.fp8.to_recipe()
    assert recipe is not None
    out, master = w.run.numeric_dtype, w.optimizer.fp8_param_gather
    if amax_comm.Get_size() == 1:
        return Fp8Gemm(recipe, out=out, from_master=master)

    def reduce(x: np.ndarray) -> np.ndarray:
        out = np.empty_like(x)
        amax_comm.Allreduce(x, out, op=MPI.MAX)
        return out
    return Fp8Gemm(recipe, reduce, out, master)


def counted_once(grid: ProcessGrid, lp: LocalParam, experts: bool, sharded: bool) -> bool:
    """Whether this rank counts `lp` in the gradient norm: TP-split tensors on every TP
    rank, replicated ones on the first, the tied table on the first stage. With experts
    reduced apart (norm over the world): sharded (ZeRO-1), every rank its disjoint shares;
    otherwise one DP x CP replica, experts on expert-DP rank 0."""
    if lp.name == "wte" and grid.pp_rank > 0:
        return False
    if not experts or sharded:
        return lp.tp_split or grid.tp_rank == 0
    if lp.expert:
        return grid.edp_rank == 0
    return (lp.tp_split or grid.tp_rank == 0) and grid.dp_rank == 0 and grid.cp_rank == 0


def run(ctx: RankContext) -> dict[str, Any]:
    """Train for run.iterations; rank 0 prints one line per iteration and the summary."""
    w, grid = ctx.w, ctx.grid
    cfg, gb, dims = resolve(w)
    trainer = build(ctx, ctx.tl, numerics=ctx.numerics)
    trainer.keep_first_grads = w.train.check_reference and ctx.numerics and \
        judges_gradients(w.run.numeric_dtype)
    drift = drift_log(ctx, trainer)
    model = trainer.model
    mem = train_memory(w, ctx.spec.dram_capacity_bytes, grid.pp_rank)
    _header(ctx, cfg, gb, dims, mem.line())
    flops = {"model": model_flops(cfg, gb),
             "hardware": hardware_flops(cfg, gb, w.train.recompute),
             "devices": grid.shape.size,            # emulated GPUs (folded or not)
             "peak_flops_per_s": ctx.spec.peak(w.run.emulated_dtype)}
    rows: list[dict[str, Any]] = []
    t_run = time.perf_counter()
    reports_loss = grid.last_stage and grid.tp_rank == 0
    if ctx.rank == 0 and ctx.log.heartbeat_s > 0:
        trainer.step.heartbeat = Heartbeat(ctx.log.heartbeat_s, grid.pp_rank)
    for it in range(w.run.iterations):
        ctx.maybe_fail(it)
        ctx.writer.mark()
        wall0 = time.perf_counter()
        with ctx.tl.labelled(iteration=it):
            share = trainer.train_step(it)
        if drift is not None:
            drift.after_step(it)
        ctx.end_iteration()
        arrive(ctx.world)       # pipeline stages end their step far apart
        loss = ctx.world.allreduce(share if reports_loss else 0.0, op=MPI.SUM)  # reporting
        wall = ctx.world.allreduce(time.perf_counter() - wall0, op=MPI.MAX)
        rows.append(_report_iteration(ctx, it, loss, wall, flops,
                                      _eta(t_run, it + 1, w.run.iterations),
                                      ctx.log.shows(it, w.run.iterations)))
        if trainer.opt.scaler is not None:      # FP16: the scale the step ran with
            rows[-1] |= {"loss_scale": model.loss_scale, "skipped": not trainer.taken}
    summary: dict[str, Any] = {"model": cfg.name, "params": cfg.param_count(),
                               "global_batch": gb, "tp": grid.tp, "dp": grid.dp,
                               "pp": grid.pp, "micro_batch": dims.batch,
                               "micro_batches": micro_batches(w),
                               "schedule": w.parallel.schedule,
                               "virtual_stages": w.parallel.virtual_stages,
                               "recompute": w.train.recompute,
                               "sequence_parallel": dims.sp, "iterations": rows,
                               "flops": flops,
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
    for params in (trainer.grads.params, trainer.grads.expert_params):
        if params is not None and ctx.numerics:    # ZeRO-3: whole again
            params.unshard()
    if drift is not None:
        drift.after_run(w.run.iterations - 1)
    if model.moe is not None:              # what each rank routed (`routing.npz`)
        write_routing(ctx.world, model.moe.log, ctx.out / ROUTING, cfg.layers,
                      gb * cfg.seq_len, ctx.rank, model.moe.moe)
    held = ctx.world.allgather((grid.pp_rank, model.peak_saved))
    summary["in_flight"] = {str(stage): n for stage, n in sorted(set(held))}
    if ctx.numerics:                # bit-level identity of every rank's parameters
        summary["params_sha256"] = ctx.world.gather(params_digest(model.P), root=0)
    if w.train.check_reference and ctx.numerics:
        summary |= reference_summary(ctx, trainer, [r["loss"] for r in rows], drift)
    return summary


def params_digest(P: dict[str, Any]) -> str:
    """SHA-256 over a rank's parameter tensors (sorted by name): equal digests mean
    bit-identical parameters."""
    h = sha256()
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
            f"tp={ctx.grid.tp}{f' x cp={ctx.grid.cp}' if ctx.grid.cp > 1 else ''} x "
            f"dp={ctx.grid.dp} x pp={ctx.grid.pp}{' + SP' if dims.sp else ''}"
            f" ({_pipeline_words(w)}) on "
            f"{ctx.spec.name}, {w.run.emulated_dtype} emulated"
            f"{(', FP8 GEMMs (' + w.fp8.recipe + ')') if w.fp8.on else ''}, numerics "
            f"{w.run.numerics}{' (' + w.run.numeric_dtype + ')' if ctx.numerics else ''}, "
            f"{w.optimizer.name}{f' (ZeRO-{w.optimizer.zero})' if w.optimizer.zero else ''}, "
            f"overlap {w.overlap.strategy}"
            + (f", Sunway {w.sunway.mode} {w.sunway.attention} scheduler {w.sunway.scheduler}"
               if ctx.spec.kind == "sunway" else ""),
            f"memory per rank{' of stage 0' if ctx.grid.pp > 1 else ''}: {mem}",
            *_fold_words(ctx),
            f"{'iter':>4} {'loss':>10} {'iteration ms':>13} {'compute ms':>11} "
            f"{'TP comm ms':>11} {'DP comm ms':>11} {'DP total ms':>12} {'idle ms':>9} "
            f"{'MFU %':>6} {'wall s':>8}   progress (rank 0; comm = exposed)")


def _fold_words(ctx: RankContext) -> list[str]:
    """What a folded run's ranks stand for, and why its classes are split (none when
    unfolded)."""
    g = ctx.grid
    if g.fold is None:
        return []
    return [f"folded: {ctx.world.Get_size()} MPI ranks stand for {g.shape.size} emulated "
            f"GPUs (run.fold; traces expand on load): {describe(g.fold)}"]


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
                      flops: dict[str, float], progress: str, show: bool = True
                      ) -> dict[str, Any]:
    """The breakdown of what this iteration committed to the traces (the same code as
    `analyze`, on the writer's blocks in memory: the cost per iteration stays flat): rank 0
    prints its own, with MFU and HFU (`flops`: what the run counts per iteration); the first
    rank of each pipeline stage (TP and DP rank 0) reports that stage."""
    grid = ctx.grid
    rt, window = None, None
    if grid.tp_rank == 0 and grid.dp_rank == 0:
        # one pass over the iteration's blocks: its window from every event, and only the
        # events the breakdown counts kept (messages, three in four, are not)
        kept: list[np.ndarray] = []

        def keep(blocks: Iterator[np.ndarray]) -> Iterator[np.ndarray]:
            for block in blocks:
                kept.append(block[counted(block)])
                yield block
        window = window_of(keep(ctx.writer.blocks_since_mark(BREAKDOWN_FIELDS)), it, grid.rank)
        rt = make_trace({"rank": grid.rank}, np.concatenate(kept), list(ctx.writer.strings))
    whole = iteration_breakdown(rt, it, window) if ctx.rank == 0 and rt else None
    arrive(ctx.world)           # while rank 0 reads its iteration back
    b = ctx.world.bcast(whole, root=0)
    mine = None if rt is None else \
        iteration_breakdown(rt, it, (b.t_start, b.t_end), sync_is_idle=True)
    arrive(ctx.world)           # while each stage's first rank breaks its own down
    stages = {stage: br for stage, br in ctx.world.allgather((grid.pp_rank, mine))
              if br is not None}
    devices, peak = flops["devices"], flops["peak_flops_per_s"]
    mfu = utilization(flops["model"], b.iteration_s, int(devices), peak)
    hfu = utilization(flops["hardware"], b.iteration_s, int(devices), peak)
    ms = 1e3
    loss_txt = f"{loss:>10.5f}" if ctx.numerics else f"{'-':>10}"
    if show:
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

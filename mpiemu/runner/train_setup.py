"""Training workloads before they run: the resolved model and micro-batch sizes, every check of
the configuration (grid divisibility, pipeline, memory fit, device kinds) and the memory a
rank of each pipeline stage needs. Every refusal is one line naming the field, the value and
what is allowed."""
from __future__ import annotations

import os
from typing import Sequence

from ..devices.presets import list_presets, load_device
from ..devices.specs import dtype_bytes
from ..model.config import ModelConfig, braces, divisors
from ..model.dims import Dims, make_dims
from ..training.grad_buffer import GradBuffer, megatron_optimizer
from ..training.memory import GIB, Layout, MemoryReport, host_bytes, memory_report
from ..overlap.api import STRATEGY_IMPLS
from ..config.workload import Workload, resolve_device
from ..config.errors import ConfigError
from ..config.parallel_section import ParallelSection
from ..model.pipeline_split import problem
from ..config.overlap_check import check_overlap_devices
from .attention_setup import validate_latent
from .moe_setup import model_of, validate_moe

HOST_MEMORY_SHARE = 0.8    # a numerics run may use this share of the host's memory


def resolve(w: Workload) -> tuple[ModelConfig, int, Dims]:
    """The padded model, the global batch and one micro-batch's local sizes."""
    tp, dp = w.parallel.tp, w.parallel.dp
    cfg = model_of(w).for_tp(tp)
    gb = w.train.global_batch or w.model.preset_global_batch()
    mb = w.train.micro_batch or max(gb // dp, 1)
    return cfg, gb, make_dims(cfg, tp, mb, w.parallel.sequence_parallel, w.parallel.cp)


def micro_batches(w: Workload) -> int:
    """Micro-batches per DP rank per step: global batch / (micro-batch x DP)."""
    _, gb, dims = resolve(w)
    return _micro_count(w, gb, dims)


def _micro_count(w: Workload, global_batch: int, dims: Dims) -> int:
    return max(global_batch // (w.parallel.dp * dims.batch), 1)


def validate(w: Workload, world_size: int) -> None:
    """Divisibility of the model by the grid, memory fit, strategy: before any message."""
    tp, dp, sp = w.parallel.tp, w.parallel.dp, w.parallel.sequence_parallel
    cfg = model_of(w)
    ok_tp = [t for t in divisors(cfg.heads) if cfg.ffn_hidden % t == 0]
    if cfg.heads % tp:
        raise ConfigError("parallel.tp", tp, f"does not divide model.heads={cfg.heads}; "
                          f"choose tp in {braces(ok_tp)}")
    if cfg.hidden % tp or cfg.ffn_hidden % tp:
        raise ConfigError("parallel.tp", tp, f"does not divide model.hidden={cfg.hidden} and "
                          f"model.ffn_hidden={cfg.ffn_hidden}; choose tp in {braces(ok_tp)}")
    _validate_kv_heads(cfg, tp)
    _validate_cp(w, cfg)
    if w.optimizer.name == "lamb" and cfg.groups < tp:
        raise ConfigError("optimizer.name", "lamb", f"LAMB's per-tensor norms need whole K "
                          f"and V heads per rank; model.kv_heads={cfg.groups} < parallel.tp="
                          f"{tp}: use 'adam' or tp <= kv_heads")
    if sp and cfg.seq_len % tp:
        raise ConfigError("model.seq_len", cfg.seq_len, f"is not divisible by parallel.tp={tp} "
                          "under parallel.sequence_parallel; choose tp in "
                          f"{braces([t for t in ok_tp if cfg.seq_len % t == 0])} or a seq_len "
                          f"that is a multiple of {tp}")
    gb = w.train.global_batch or w.model.preset_global_batch()
    if gb % dp:
        raise ConfigError("train.global_batch", gb, f"is not divisible by parallel.dp={dp}; "
                          f"choose dp in {braces(divisors(gb))} or a global batch that is a "
                          f"multiple of {dp}")
    _validate_pipeline(w, cfg.layers, gb)
    if w.train.check_reference and w.run.numerics != "on":
        raise ConfigError("train.check_reference", True, "needs run.numerics='on' (real values)")
    if w.overlap.strategy not in STRATEGY_IMPLS:
        raise ConfigError("overlap.strategy", w.overlap.strategy, sorted(STRATEGY_IMPLS))
    _validate_sunway(w)
    _validate_kernels(w)
    _validate_update_unit(w)
    _validate_zero(w, cfg)
    _validate_precision(w, cfg)
    _validate_fp8(w, cfg)
    validate_latent(w, cfg)
    validate_moe(w, cfg)
    if resolve_device(w).kind == "gpu":
        check_overlap_devices(w, [w.overlap.strategy], "overlap.strategy")
    _validate_memory(w, world_size)


def _validate_precision(w: Workload, cfg: ModelConfig) -> None:
    """bf16 / fp16 numerics: the GEMMs of a GPU's dense layers under the sequential strategy
    (fp16's loss scaling: with the plain optimizer, whose gradients it unscales)."""
    dt = w.run.numeric_dtype
    if dt in ("fp32", "fp64") or w.run.numerics != "on":
        return
    why = None
    if cfg.moe is not None:
        why = "with experts (model.moe): their grouped GEMMs' rounding is not modelled"
    elif resolve_device(w).kind != "gpu":
        why = "on a Sunway rank (its CPEs compute in fp32 / fp64)"
    elif w.overlap.strategy != "sequential":
        why = (f"with overlap.strategy={w.overlap.strategy!r} (its fused, chunked GEMMs are "
               "exact): use 'sequential'")
    elif dt == "fp16" and w.optimizer.zero > 0:
        why = (f"with optimizer.zero={w.optimizer.zero} (fp16's loss scaling unscales the "
               "plain optimizer's gradients): use optimizer.zero = 0 or bf16")
    if why:
        raise ConfigError("run.numeric_dtype", dt, f"fp32 or fp64 {why}")


def _validate_fp8(w: Workload, cfg: ModelConfig) -> None:
    """An [fp8] recipe: FP8 tensor cores, the sequential strategy, dense layers, bf16 / fp16
    elsewhere; with numerics on, the values in bf16 or fp32 and no full recompute (a layer's
    forward run again would cast again and record its amaxes twice)."""
    if not w.fp8.on:
        if w.optimizer.fp8_param_gather:
            raise ConfigError("optimizer.fp8_param_gather", True, "false without an [fp8] "
                              "recipe (fp8.recipe = 'off')")
        return
    spec = resolve_device(w)
    why = None
    if "fp8" not in spec.peak_flops_per_s:
        why = f"on {spec.name} (no FP8 tensor cores: its preset has no peak_fp8)"
    elif w.run.numerics == "on" and w.run.numeric_dtype not in ("bf16", "fp32"):
        why = (f"with run.numeric_dtype={w.run.numeric_dtype!r} (FP8 numerics keep the "
               "other tensors in bf16, or fp32 as an fp32 model): 'bf16' or 'fp32', or "
               "run.numerics = 'off'")
    elif w.run.numerics == "on" and w.train.recompute == "full":
        why = "with train.recompute = 'full' and numerics on: use 'none' or 'selective'"
    elif w.run.emulated_dtype not in ("bf16", "fp16"):
        why = (f"with run.emulated_dtype={w.run.emulated_dtype!r} (FP8 training keeps its "
               "tensors in bf16 or fp16)")
    elif w.overlap.strategy != "sequential":
        why = f"with overlap.strategy={w.overlap.strategy!r}: use 'sequential'"
    elif cfg.moe is not None and w.run.numerics == "on":
        why = ("with experts (model.moe) and numerics on: the experts' FP8 numerics are not "
               "modelled (their grouped GEMMs are timed in FP8 with run.numerics = 'off')")
    if why:
        raise ConfigError("fp8.recipe", w.fp8.recipe, f"off {why}")


def _validate_cp(w: Workload, cfg: ModelConfig) -> None:
    """Context parallelism: 2 cp chunks of whole positions (with SP, the rank's rows split
    over TP too), flash attention (Megatron-Core runs CP in Transformer Engine's)."""
    cp, tp = w.parallel.cp, w.parallel.tp
    if cp == 1:
        return
    if cfg.seq_len % (2 * cp):
        raise ConfigError("model.seq_len", cfg.seq_len, f"is not divisible into 2 x "
                          f"parallel.cp = {2 * cp} chunks (context parallelism's causal "
                          "balance); choose a multiple of 2 cp")
    if w.parallel.sequence_parallel and (cfg.seq_len // cp) % tp:
        raise ConfigError("parallel.sequence_parallel", True, f"splits a CP rank's "
                          f"{cfg.seq_len // cp} positions over parallel.tp={tp}: they do not "
                          "divide")
    if cfg.attention != "flash":
        raise ConfigError("model.attention", cfg.attention, "context parallelism runs flash "
                          "attention (Transformer Engine's); set model.attention='flash'")


def _validate_kv_heads(cfg: ModelConfig, tp: int) -> None:
    """The KV heads split over TP, or TP a multiple of them (each then replicated over
    tp / kv_heads ranks, Megatron-Core: "a multiple or divisor"), the grouped QKV output
    split evenly."""
    g = cfg.groups
    if g % tp and tp % g:
        ok = [t for t in divisors(cfg.heads) if g % t == 0 or t % g == 0]
        raise ConfigError("parallel.tp", tp, f"neither divides nor is a multiple of "
                          f"model.kv_heads={g}; choose tp in {braces(ok)}")
    if g < tp and (cfg.heads + 2 * g) * cfg.head_dim % tp:
        raise ConfigError("parallel.tp", tp, f"does not divide the QKV output's "
                          f"{(cfg.heads + 2 * g) * cfg.head_dim} columns (model.kv_heads={g} "
                          "is replicated over TP ranks, each making an even slice)")


def _split_field(par: ParallelSection) -> tuple[str, object]:
    """The uneven-split field a refusal names (the first one set)."""
    for name in ("first_stage_layers", "last_stage_layers", "embedding_in_split",
                 "loss_in_split"):
        if getattr(par, name):
            return f"parallel.{name}", getattr(par, name)
    return "parallel.pp", par.pp


def _validate_pipeline(w: Workload, layers: int, gb: int) -> None:
    """Stages split the layers evenly; micro-batches split each DP rank's batch; the
    interleaved schedule runs micro-batches in groups of pp (Megatron-LM's requirement)."""
    par, mb = w.parallel, w.train.micro_batch
    pp, v = par.pp, par.virtual_stages
    if not par.split.even:
        why = problem(layers, pp, v, par.split)
        if why is not None:
            field, value = _split_field(par)
            raise ConfigError(field, value, f"cannot place model.layers={layers} on "
                              f"parallel.pp={pp} x virtual_stages={v}: {why}")
    elif layers % pp:
        raise ConfigError("parallel.pp", pp, f"does not divide model.layers={layers}; "
                          f"choose pp in {braces(divisors(layers))}")
    elif layers % (pp * v):
        ok = [x for x in divisors(layers // pp) if x > 1]
        raise ConfigError("parallel.virtual_stages", v, f"pp x virtual_stages = {pp * v} "
                          f"does not divide model.layers={layers}; " +
                          (f"choose virtual_stages in {braces(ok)}" if ok else
                           f"{layers // pp} layer(s) per stage cannot be split; use "
                           "parallel.schedule='1f1b'"))
    per_dp = gb // par.dp
    if mb and per_dp % mb:
        raise ConfigError("train.micro_batch", mb, f"does not divide the {per_dp} sequences "
                          f"of each DP rank (global batch {gb} / dp {par.dp}); choose one of "
                          f"{braces(divisors(per_dp))}")
    m = per_dp // (mb or per_dp)
    if par.schedule == "interleaved" and (m % pp or m < pp):
        ok = [b for b in divisors(per_dp) if (per_dp // b) % pp == 0]
        raise ConfigError("train.micro_batch", mb, f"gives {m} micro-batches per DP rank; the "
                          f"interleaved schedule needs a multiple of parallel.pp={pp}; choose "
                          f"micro_batch in {braces(ok)}")
    if resolve_device(w).kind == "sunway" and w.train.recompute == "selective":
        raise ConfigError("train.recompute", "selective", "Sunway ranks charge a layer as one "
                          "CG schedule; use 'none' or 'full'")


def _validate_sunway(w: Workload) -> None:
    """Sunway ranks: a matching preset, all-reduce TP (SWA 3.1), no GPU overlap model, and
    the GPT blocks SwFormer schedules (LayerNorm, GeLU, multi-head attention, biases)."""
    spec = resolve_device(w)
    if spec.kind != "sunway":
        return
    w.sunway.check_device(spec.kind, spec.compute_units)
    cfg = model_of(w)
    for key, gpt in (("norm_kind", "layernorm"), ("activation", "gelu"),
                     ("position", "learned")):
        if getattr(cfg, key) != gpt:
            raise ConfigError(f"model.{key}", getattr(cfg, key), f"Sunway ranks schedule "
                              f"SwFormer's GPT layer; use '{gpt}'")
    if cfg.groups != cfg.heads or not cfg.bias:
        raise ConfigError("model.kv_heads" if cfg.groups != cfg.heads else "model.bias",
                          cfg.kv_heads if cfg.groups != cfg.heads else False,
                          "Sunway ranks schedule SwFormer's GPT layer (multi-head attention "
                          "with biases)")
    if cfg.attn_width != cfg.hidden:
        raise ConfigError("model.kv_channels", cfg.kv_channels, "Sunway ranks schedule "
                          "SwFormer's GPT layer (heads x head_dim = model.hidden); use 0")
    if w.parallel.sequence_parallel:
        raise ConfigError("parallel.sequence_parallel", True, "Sunway ranks model Megatron TP "
                          "with all-reduces (SWattention / SwFormer); set it to false")
    if w.overlap.strategy != "sequential":
        raise ConfigError("overlap.strategy", w.overlap.strategy, "Sunway ranks run GEMM and "
                          "all-reduce in sequence (T3 is a GPU memory-system design); use "
                          "'sequential'")


def _validate_kernels(w: Workload) -> None:
    """Fused epilogues ride on the plain GEMM; the overlapped all-gather GEMM (SP) has none;
    they model cuBLASLt's GeLU epilogue (SwiGLU has none)."""
    if w.train.fuse_epilogues and model_of(w).gated:
        raise ConfigError("train.fuse_epilogues", True, "models cuBLASLt's bias + GeLU "
                          "epilogues; it needs model.activation='gelu'")
    if w.train.fuse_epilogues and w.parallel.sequence_parallel and w.parallel.tp > 1:
        raise ConfigError("train.fuse_epilogues", True, "needs parallel.sequence_parallel="
                          "false (the all-gather -> GEMM of SP has no epilogue model)")
    if resolve_device(w).kind == "sunway" and (w.train.fuse_epilogues or
                                                model_of(w).attention in ("sd", "sdf")):
        raise ConfigError("model.attention" if not w.train.fuse_epilogues
                          else "train.fuse_epilogues", model_of(w).attention
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


def _validate_zero(w: Workload, cfg: ModelConfig) -> None:
    """ZeRO-2 / 3 reduce-scatter each layer's gradient during every micro-batch's backward
    (`training.fully_sharded`): no reduction deferred to the step's end."""
    zero = w.optimizer.zero
    if zero < 2:
        return
    if not w.train.overlap_grad_reduce:
        raise ConfigError("train.overlap_grad_reduce", False, f"must be true with "
                          f"optimizer.zero={zero} (gradients are reduce-scattered during "
                          "backward, layer by layer)")
    if w.train.ddp != "core":
        raise ConfigError("train.ddp", w.train.ddp, f"must be 'core' with optimizer.zero="
                          f"{zero} (local DDP reduces one buffer after backward)")
    group, ranks = w.optimizer.shard_group, w.parallel.dp * w.parallel.cp
    if group and ranks % group:
        raise ConfigError("optimizer.shard_group", group, f"does not divide the {ranks} ranks "
                          f"of DP x CP; choose one of {braces(divisors(ranks))}")
    if w.parallel.pp > 1 and cfg.tied_embeddings:
        raise ConfigError("optimizer.zero", zero, "needs untied embeddings with parallel.pp > "
                          "1 (the tied table's gradient is summed across stages first); set "
                          "model.tied_embeddings=false or optimizer.zero <= 1")


def grad_buffer(w: Workload, kind: str) -> GradBuffer | None:
    """Megatron-LM's `main_grad` buffer, where a GPU rank (`kind`) trains as Megatron's
    mixed-precision stack (`training.grad_buffer`); Sunway ranks and the thesis's LAMB keep none."""
    if kind == "sunway" or not megatron_optimizer(w.optimizer):
        return None
    return GradBuffer.megatron(w.run.emulated_dtype, w.train.grad_accumulation_fusion)


def layout(w: Workload, stage: int, micro: int | None = None) -> Layout:
    """The memory-relevant placement and step of a rank of pipeline stage `stage`
    (`micro`: the micro-batch count, when the caller has it)."""
    par = w.parallel
    return Layout(pp=par.pp, stage=stage, chunks=par.virtual_stages, schedule=par.schedule,
                  micro_batches=micro or micro_batches(w), recompute=w.train.recompute,
                  dp=w.optimizer.shard_group or par.dp * par.cp, zero=w.optimizer.zero,
                  prefetch=w.optimizer.prefetch,
                  reshard_after_forward=w.optimizer.reshard_after_forward,
                  split=par.split, ep=par.ep, etp=par.etp, fp8_copies=2 if w.fp8.on else 0,
                  fp8_params=w.optimizer.fp8_param_gather, combined=w.moe.overlap_ep_comm)


def stage_memories(w: Workload, capacity_bytes: float, stages: Sequence[int]
                   ) -> list[MemoryReport]:
    """The memory of a rank of each of these pipeline stages (the model resolved once)."""
    cfg, gb, dims = resolve(w)
    micro = _micro_count(w, gb, dims)
    e = dtype_bytes(w.run.emulated_dtype)
    buf = grad_buffer(w, resolve_device(w).kind)      # gradients kept in its dtype, if any
    grad_bytes = buf.main if buf is not None else 0
    return [memory_report(cfg, dims, e, capacity_bytes,
                          layout(w, s, micro)._replace(grad_bytes=grad_bytes)) for s in stages]


def train_memory(w: Workload, capacity_bytes: float, stage: int) -> MemoryReport:
    return stage_memories(w, capacity_bytes, [stage])[0]


def _validate_memory(w: Workload, world_size: int) -> None:
    cfg, gb, dims = resolve(w)
    spec = resolve_device(w)
    reps = stage_memories(w, spec.dram_capacity_bytes, range(w.parallel.pp))
    stage = max(range(len(reps)), key=lambda s: reps[s].total_bytes)
    if not reps[stage].fits and w.train.memory_check == "error":
        where = f" (pipeline stage {stage}, the fullest)" if w.parallel.pp > 1 else ""
        raise ConfigError("model.preset", w.model.preset,
                          f"does not fit on {spec.name} at tp={w.parallel.tp}, "
                          f"pp={w.parallel.pp}: {reps[stage].line()} per rank{where}; raise "
                          "parallel.tp or parallel.pp, lower train.micro_batch, set "
                          "parallel.sequence_parallel=true, train.recompute, "
                          "optimizer.zero=1 or model.attention='flash', or "
                          "train.memory_check='warn' to emulate it anyway")
    if w.run.numerics == "on":
        item = 8 if w.run.numeric_dtype == "fp64" else 4
        micro = _micro_count(w, gb, dims)
        per_stage = [host_bytes(cfg, dims, item, layout(w, s, micro))
                     for s in range(w.parallel.pp)]
        need = sum(per_stage) * world_size / w.parallel.pp
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * HOST_MEMORY_SHARE
        if need > have:
            raise ConfigError("run.numerics", "on", f"needs ~{need / GIB:.1f} GiB of host "
                              f"memory for {world_size} ranks, this host has {have / GIB:.1f} "
                              "GiB to spare; use run.numerics='off' (timing only) or a "
                              "smaller model")


def reference_tolerance(w: Workload) -> float:
    """The check's relative tolerance: given, or by the numerics (what it judges:
    `training.check`).

    fp64: the parameters after the run, 1e-10. fp32: iteration 0's gradients and the
    losses, 2**-17 (128 units of fp32 rounding): the runs sum the same terms in other
    orders (TP partials, micro-batches, sequence-major rows), each order a few roundings
    from the exact sum; the quickstart's layouts (2, 1, 1), (1, 2, 1), (2, 2, 2) differ by
    at most 7.8e-7. bf16: 2**-5 (four bf16 steps of 2**-7): a value the two runs round in
    other orders can land one bf16 step apart, and the backward of a layer passes a few
    such places; measured at most 8.5e-3 on the same layouts. A wrong shard or a wrong
    gradient is off by far more.

    FP8 ([fp8] recipe, numerics on): a per-tensor scale follows its tensor's amax, so an
    amax one rounding apart (another summation order anywhere upstream) moves the scale
    and re-rounds the whole tensor in FP8: the two runs then differ by FP8 quantization
    noise, as far apart as FP8 is from exact. The bound is E5M2's relative step, 2**-2
    (measured at most 0.13 on the layouts above, `tests/test_fp8_numerics.py`). Block
    scaling's power-of-2 tile scales move only when a tile's amax crosses a power of 2:
    with fp32 outputs, where the orders differ by fp32 rounding only, 2**-10 (measured
    2.3e-4); with bf16 outputs each rank's bf16 partial sums re-round some FP8 values,
    2**-2 as above.
    """
    if w.train.reference_rtol:
        return w.train.reference_rtol
    if w.fp8.on and w.run.numerics == "on":
        return 2.0 ** -10 if w.fp8.recipe == "block" and w.run.numeric_dtype == "fp32" \
            else 2.0 ** -2
    return {"fp64": 1e-10, "fp32": 2.0 ** -17}.get(w.run.numeric_dtype, 2.0 ** -5)

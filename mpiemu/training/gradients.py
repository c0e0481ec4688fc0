"""A stage's gradients in one training step: where backward hands them, and the reductions
that end the step.

Each micro-batch's gradient of a parameter reaches Megatron's `main_grad` buffer through its
hook (`grad_buffer`); after the last micro-batch it joins the DP buckets (`data_parallel`),
which reduce while backward goes on (Megatron: no_sync for the other micro-batches).
Gradients reduced elsewhere first join the buckets at the step's end: under sequence
parallelism those of parameters that saw only the rank's sequence rows, and with tp > 1
QK-norm's gains, which saw only the rank's heads (both all-reduced over TP), and with
pp > 1 the tied embedding's (all-reduced between the first and last stage).
With the distributed optimizer's overlapped parameter gather, a forward waits for its
layer's parameters here.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..comm.p2p import TimedComm
from ..model.executor import Executor
from ..model.ops import Cost
from ..model.stage import StageModel
from ..sim.timeline import SimTime
from .data_parallel import GradBuckets
from .fully_sharded import ShardedGrads, ShardedParams, hybrid, units, wire_itemsize
from .grad_buffer import GradBuffer


class StageGradients:
    """The training step's side of a stage (`model.stage.StageHooks`)."""

    def __init__(self, model: StageModel, ex: Executor, dp: TimedComm, *,
                 grad_buffer: GradBuffer | None, bucket_bytes: float, bidirectional: bool,
                 embed: TimedComm | None = None, zero: int = 0,
                 overlap_grad_reduce: bool = True, ddp: str = "core",
                 prefetch: bool = True, reshard_after_forward: bool = True,
                 shard_group: int = 0, experts: TimedComm | None = None,
                 fp8_param_gather: bool = False) -> None:
        self.model, self.E, self.embed, self.grad_buffer = model, ex, embed, grad_buffer
        self.dp = dp
        # gradients travel in the dtype they are kept in: Megatron's buffer's, else the model's
        self.grad_bytes = ex.e if grad_buffer is None else grad_buffer.main
        # Megatron's averaging over DP (`data_parallel`): per bucket (core), or the whole buffer
        # once after backward, then reduced in one call (local)
        scaled = grad_buffer is not None
        self.scale_whole_buffer = scaled and ddp == "local"
        # experts split over EP reduce over expert data parallelism, in buckets of their own
        # (ZeRO-2 / 3: in units of their own, sharded over expert DP)
        split = experts is not None
        dense = [lp for lp in model.specs if not (split and lp.expert)]
        sizes = {lp.name: lp.size for lp in dense}
        own = [lp for lp in model.specs if split and lp.expert]
        layer_of = {lp.name: lp.layer for lp in model.specs}
        self.expert_buckets: GradBuckets | ShardedGrads | None = None
        if experts is not None and zero >= 2 and experts.size > 1:
            self.expert_buckets = ShardedGrads(
                experts, self.grad_bytes, units(own, experts), layer_of, ex.cost.reduction_s,
                bidirectional, group="edp")
        elif experts is not None:
            self.expert_buckets = GradBuckets(
                experts, self.grad_bytes, bucket_bytes, {lp.name: lp.size for lp in own},
                bidirectional, shard=zero == 1, overlap=overlap_grad_reduce,
                prescale=self._scale if scaled and ddp == "core" else None,
                reduce_s=ex.cost.reduction_s)
        sharded = zero >= 2 and dp.size > 1       # ZeRO-2 / 3: per unit, per micro-batch
        shard, replicas = hybrid(dp, shard_group) if sharded else (dp, None)
        self.buckets: GradBuckets | ShardedGrads = ShardedGrads(
            shard, self.grad_bytes, units(dense, shard), layer_of, ex.cost.reduction_s,
            bidirectional,
            partial=self._sp_grad_sync if self._tp_partial() else None,
            replicas=replicas) if sharded else GradBuckets(
            dp, self.grad_bytes, math.inf if ddp == "local" else bucket_bytes,
            sizes, bidirectional, shard=zero == 1,
            overlap=overlap_grad_reduce,
            prescale=self._scale if scaled and ddp == "core" else None,
            reduce_s=ex.cost.reduction_s)
        # gradients reduced elsewhere first (TP under SP; the tied table across stages):
        # they join the DP buckets at the end of the step (ZeRO-2 / 3: each unit's SP ones
        # are summed over TP just before it is reduce-scattered)
        sp_partial = [] if sharded else self._tp_partial()
        self.tied_across_stages = model.pp > 1 and model.cfg.tied_embeddings \
            and "wte" in model.P            # a first or last stage, the table tied
        self.deferred = sp_partial + (["wte"] if self.tied_across_stages else [])
        self.param_ready: dict[int, float] = {}     # layer -> parameters gathered (ZeRO-1)
        self.params = ShardedParams(
            model.P, self.buckets.units, ex, shard, prefetch=prefetch,
            reshard_after_forward=reshard_after_forward,
            wire={k: wire_itemsize((lp for lp in model.specs if lp.name in u.names), ex.e,
                                   fp8_param_gather) for k, u in self.buckets.units.items()}) \
            if zero == 3 and isinstance(self.buckets, ShardedGrads) else None
        self.expert_params = ShardedParams(
            model.P, self.expert_buckets.units, ex, self.expert_buckets.dp,
            prefetch=prefetch, reshard_after_forward=reshard_after_forward,
            wire={k: wire_itemsize((lp for lp in own if lp.name in u.names), ex.e,
                                   fp8_param_gather)
                  for k, u in self.expert_buckets.units.items()}, group="edp") \
            if zero == 3 and isinstance(self.expert_buckets, ShardedGrads) else None
        model.hooks = self

    # -- the hooks a stage's passes call ----------------------------------------------------
    def params_needed(self, layer: int, upcoming: int | None = None,
                      backward: bool = False) -> None:
        """A pass needs its layer's parameters: ZeRO-3 gathers them (and prefetches the
        next unit's); ZeRO-1 / 2 with the overlapped gather waits for the optimizer's."""
        if self.expert_params is not None:
            self.expert_params.need(layer, upcoming)
        if self.params is not None:
            self.params.need(layer, upcoming)
        elif self.param_ready and not backward:
            self.E.wait_until(self.param_ready.get(layer, 0.0))

    def params_done(self, layer: int, backward: bool) -> None:
        """ZeRO-3 frees the layer's gathered parameters."""
        for params in (self.params, self.expert_params):
            if params is not None:
                params.done(layer, backward)

    def grads_ready(self, names: list[str], micro: int) -> None:
        """One micro-batch's gradients `names` are computed: each into Megatron's buffer
        (its hook), and into the DP buckets after the last micro-batch (ZeRO-2 / 3: every
        micro-batch, into the shards)."""
        by_name = self.model.by_name
        for n in names:      # a layer's matrix, or the output layer's: a wgrad GEMM's
            lp = by_name[n]
            self._hook(n, from_gemm=lp.decay and (lp.layer >= 0 or n == "lm_head"))
        last = micro == self.model.micro_batches - 1
        if self.expert_buckets is not None:
            if last or isinstance(self.expert_buckets, ShardedGrads):
                self.expert_buckets.ready([n for n in names if by_name[n].expert],
                                          self.model.G, self.E.t)
            names = [n for n in names if not by_name[n].expert]
        if last or isinstance(self.buckets, ShardedGrads):
            self.buckets.ready([n for n in names if n not in self.deferred], self.model.G,
                               self.E.t)

    def grad_accumulated(self, name: str) -> None:
        """A weight-gradient GEMM's share of `name` (the tied table's head side)."""
        self._hook(name, from_gemm=True)

    def _hook(self, name: str, from_gemm: bool) -> None:
        """`main_grad.add_(grad)` for one parameter (`grad_buffer`); nothing when a
        weight-gradient GEMM accumulated it or the rank keeps no such buffer."""
        gb = self.grad_buffer
        if gb is not None and gb.hooked(from_gemm):
            self.E.kernel(f"{name}.grad_acc", gb.hook_cost(self.model.by_name[name].size))

    # -- the step -----------------------------------------------------------------------------
    def begin_step(self) -> None:
        self.buckets.reset()
        if self.expert_buckets is not None:
            self.expert_buckets.reset()

    def reduced(self) -> dict[str, np.ndarray]:
        """Host-side, outside emulated time (the reference check): every gradient of the
        rank's parameters as the optimizer receives it, reduced; a bucket the distributed
        optimizer shards (ZeRO) gathered from the DP ranks' shares. Collective over DP."""
        out = {k: np.array(v) for k, v in self.model.G.items() if v is not None}
        shapes = {lp.name: lp.shape for lp in self.model.specs}
        for buckets in (self.buckets, self.expert_buckets):
            for sh in getattr(buckets, "shards", []) if buckets is not None else []:
                assert buckets is not None
                whole = np.concatenate(buckets.dp.comm.allgather(np.asarray(sh.grad)))
                off = 0
                for n in sh.names:
                    size = int(np.prod(shapes[n]))
                    out[n] = whole[off:off + size].reshape(shapes[n])
                    off += size
        return out

    def finish_step(self) -> None:
        """After the last backward: the TP (SP) and tied-embedding reductions, then the DP
        buckets; the optimizer needs them all."""
        m = self.model
        with self.E.labelled(phase="bwd", layer=-1):
            self._sp_grad_sync()
            if self.scale_whole_buffer:
                self._scale("dp.grad_scale", sum(lp.size for lp in m.specs))
            self._embedding_grad_sync()
            if self.deferred:
                self.buckets.ready(self.deferred, m.G, self.E.t)
            if self.expert_buckets is not None:
                self.E.wait_until(self.expert_buckets.finish(m.G, self.E.t))
            self.E.wait_until(self.buckets.finish(m.G, self.E.t))
            if m.moe is not None and m.moe.moe.expert_bias:
                self._update_expert_bias()

    def _update_expert_bias(self) -> None:
        """The step's kept tokens per expert of each MoE layer, summed over every rank of
        the stage (TP, then DP x CP: all of them route tokens), move the expert biases
        (Megatron-Core finalize_model_grads -> `_update_router_expert_bias`)."""
        m, E = self.model, self.E
        run = m.moe
        assert run is not None
        layers = sorted(run.step_counts)
        k = run.moe.experts
        flat = np.concatenate([run.step_counts[i] for i in layers]).astype(np.float64) \
            if E.on else None
        flat = E.tp_sum("moe.expert_bias.counts.tp", flat, k * len(layers), 8)
        flat = E.all_reduce(self.dp, "moe.expert_bias.counts.dp", flat, k * len(layers), 8) \
            if self.dp.size > 1 else flat
        if flat is not None:
            for j, i in enumerate(layers):
                run.update_bias(i, flat[j * k:(j + 1) * k])

    def _scale(self, label: str, count: int) -> SimTime:
        """Gradients in Megatron's buffer divided by the DP size in place (read and write
        `count` elements, `data_parallel`); cost only: the loss is already the global mean."""
        main = self.grad_bytes
        self.E.kernel(label, Cost(count, count * main, count * main))
        return self.E.t

    def _embedding_grad_sync(self) -> None:
        """All-reduce the tied table's gradient between the first and last stage (Megatron
        `_allreduce_word_embedding_grads`)."""
        m = self.model
        if self.embed is None or not self.tied_across_stages:
            return
        g = m.G["wte"]
        flat = None if g is None else np.ravel(g)
        out = self.E.all_reduce(self.embed, "pp.embedding_grads.ar", flat,
                                m.by_name["wte"].size, self.grad_bytes)
        if out is not None and g is not None:
            m.G["wte"] = out.reshape(g.shape)

    def _tp_partial(self) -> list[str]:
        """The gradients that are partial sums over TP (`LocalParam.tp_partial`)."""
        d = self.model.d
        return [lp.name for lp in self.model.specs if lp.tp_partial(d.sp, d.tp)]

    def _sp_grad_sync(self, among: list[str] | None = None) -> None:
        """All-reduce over TP the gradients of replicated parameters which saw only this
        rank's sequence rows (Megatron SP) or heads (QK-norm's gains); `among`: of these
        tensors only (one unit's)."""
        m = self.model
        names = [n for n in self._tp_partial() if among is None or n in among]
        if not names or (among is None and isinstance(self.buckets, ShardedGrads)):
            return
        count = sum(m.by_name[n].size for n in names)
        flat = None
        if self.E.on:
            flat = np.concatenate([np.ravel(m.G[n]) for n in names])   # type: ignore[arg-type]
        label = "tp.sp_grads" if m.d.sp else "tp.head_grads"
        out = self.E.tp_sum(label, flat, count, self.grad_bytes)
        if out is not None:
            offset = 0
            for n in names:
                g: Any = m.G[n]
                m.G[n] = out[offset:offset + g.size].reshape(g.shape)
                offset += g.size

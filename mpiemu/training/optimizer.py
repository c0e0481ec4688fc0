"""Adam and LAMB on a rank's parameter shards, fp32 master weights and states.

Each rank updates only its shard (thesis 4.5.1: LAMB work splits evenly under TP). Norms
that span a tensor split over TP ranks are partial sums all-reduced over TP: the global
gradient norm (clipping, and LAMB, thesis 4.2.3: it must finish before any update) and
LAMB's per-tensor ||w|| and ||update|| (trust ratio, You et al. 2020). Replicated tensors
count once (on TP rank 0) in the global norm. Charged per layer as fused multi-tensor
kernels; bytes follow thesis 4.3 / Fig. 6.2 (LAMB touches 13 values per parameter).
With `optimizer.on = "nmc"` the same math is charged as near-bank compute (`devices/nmc.py`,
thesis ch. 6): the global gradient norm stays on the GPU, every other phase runs on the
DRAM banks' ALUs (`optim.nmc.<phase>`), LAMB's per-tensor norms end with one GPU reduction
of the banks' partial sums (`optim.nmc.norms.reduce`).
"""
from __future__ import annotations

from collections import defaultdict
from typing import Callable, Iterator

import numpy as np
from mpi4py import MPI

from ..comm.p2p import TimedComm
from ..devices import nmc
from .adam import (LAMB1_FLOPS, MASTER_BYTES, adam_cost, adam_direction, charge_passes,
                   clip_coeff, mixed_precision_passes)
from .data_parallel import GradBuckets
from .config import OptimizerConfig
from ..model.executor import Executor
from .grad_buffer import megatron_optimizer
from ..model.block import Params
from ..model.ops import Cost
from ..model.tensor_parallel import LocalParam
from ..precision.loss_scale import DynamicLossScaler
from .distributed_optimizer import DistributedAdam
from .fully_sharded import ShardedGrads, ShardedParams



def _arrays(d: Params) -> dict[str, np.ndarray]:
    """The real arrays of a numerics run (empty on shapes alone)."""
    return {k: v for k, v in d.items() if v is not None}


def state_bytes_per_param(e: int) -> int:
    """fp32 master copy (when the emulated dtype is narrower) plus Adam/LAMB m and v."""
    return (MASTER_BYTES if e < MASTER_BYTES else 0) + 2 * MASTER_BYTES


class ShardedOptimizer:
    """One optimizer step over a rank's local parameters (numerics and charges)."""

    def __init__(self, opt: OptimizerConfig, specs: list[LocalParam], ex: Executor,
                 tp_rank: int, P: Params, norm: TimedComm | None = None,
                 counted: Callable[[LocalParam], bool] | None = None,
                 buckets: GradBuckets | ShardedGrads | None = None,
                 params: ShardedParams | None = None,
                 expert_buckets: GradBuckets | ShardedGrads | None = None,
                 scaler: DynamicLossScaler | None = None,
                 expert_params: ShardedParams | None = None) -> None:
        self.opt, self.specs, self.E, self.tp_rank = opt, specs, ex, tp_rank
        self.scaler = scaler            # FP16 numerics: the loss scale, skips on overflow
        self.skipped = 0
        # the global gradient norm: summed over one model replica (TP x PP ranks), every
        # tensor once (replicated ones on TP rank 0, the tied table on the first stage)
        self.norm_comm = norm if norm is not None else ex.tp
        self.counted = counted or (lambda lp: lp.tp_split or tp_rank == 0)
        self.zero: DistributedAdam | None = None
        if opt.distributed and buckets is not None and buckets.dp.size > 1:
            self.zero = DistributedAdam(opt, specs, ex, buckets, self.norm_of, self.counted,
                                        params)
        # experts split over EP: their shares over expert DP (Megatron's expert distributed
        # optimizer), or, where each expert lives on one rank, a plain update there
        self.experts: DistributedAdam | list[LocalParam] | None = None
        if self.zero is not None and expert_buckets is not None:
            self.experts = [lp for lp in specs if lp.expert]
            if expert_buckets.dp.size > 1:
                self.experts = DistributedAdam(opt, specs, ex, expert_buckets, self.norm_of,
                                               self.counted, expert_params)
                self.experts.param_ready = self.zero.param_ready    # one map, max over both
        self.m = {n: None if w is None else np.zeros_like(w) for n, w in P.items()}
        self.v = {n: None if w is None else np.zeros_like(w) for n, w in P.items()}
        self.steps = 0
        self.by_layer: dict[int, list[LocalParam]] = defaultdict(list)
        for lp in specs:
            self.by_layer[lp.layer].append(lp)
        self.on_nmc = opt.on == "nmc"
        # Adam on the GPU runs as Megatron-LM's mixed-precision optimizer: fp32 gradients,
        # with the memory passes around the update (`adam.mixed_precision_passes`)
        self.fp32_grads = megatron_optimizer(opt)
        e = ex.e
        self.accesses = nmc.update_accesses(opt.name, e, e if e < MASTER_BYTES else 0)

    def _charge(self, phase: str, lps: list[LocalParam], cost: Cost) -> None:
        """One phase of one layer: a GPU kernel, or NMC work on the banks (thesis ch. 6)."""
        E = self.E
        if not self.on_nmc:
            E.kernel(f"optim.{self.opt.name}" + ("" if phase == "adam" else f".{phase}"), cost)
            return
        t = nmc.phase_s(E.cost.spec, self.accesses, phase, [lp.size for lp in lps])
        E.occupy(f"optim.nmc.{phase}", t, flops=cost.flops)

    def _reduce_partial_sums(self) -> None:
        """NMC: the GPU reduces the banks' partial sums of LAMB's per-tensor norms (6.3)."""
        if self.on_nmc:
            t, nbytes = nmc.partial_sums(self.E.cost.spec, 2 * len(self.specs))
            self.E.occupy("optim.nmc.norms.reduce", t, dram_bytes=nbytes)

    def _layers(self) -> Iterator[tuple[int, list[LocalParam], int]]:
        for layer in sorted(self.by_layer):
            lps = self.by_layer[layer]
            with self.E.labelled(layer=layer):
                yield layer, lps, sum(lp.size for lp in lps)

    def step(self, P: Params, G: Params) -> bool:
        """Clip by the global gradient norm if asked, then Adam or LAMB on every shard; False
        when FP16's loss scaler skips the step (a gradient overflowed on some rank)."""
        if self.scaler is not None and self.E.on and self._overflowed(G):
            self.skipped += 1
            self._update({}, G)      # charged as a taken step: emulated time never depends
            return False             # on the values; the weights and states stay
        self.steps += 1
        if self.zero is not None and self.experts is None:    # ZeRO-1: this DP rank's shares
            self.zero.step(P)
        elif self.zero is not None:
            self._step_with_experts(P, G)
        else:
            self._update(_arrays(P), G)
        return True

    def _overflowed(self, G: Params) -> bool:
        """FP16 (Megatron's `_unscale_main_grads_and_check_for_nan`): the fp32 main gradients
        divided by the loss scale; True if any is inf or NaN on any rank of the model
        replica (host-side: one flag, outside emulated time); the scaler moves either way."""
        assert self.scaler is not None
        inv = 1.0 / self.scaler.scale
        bad = False
        for k, g in G.items():
            if g is not None:
                unscaled = g * inv
                G[k] = unscaled
                bad = bad or not bool(np.all(np.isfinite(unscaled)))
        found = bool(self.norm_comm.comm.allreduce(bad, op=MPI.LOR))
        return not self.scaler.update(found)

    def _update(self, P: dict[str, np.ndarray], G: Params) -> None:
        """The update of the arrays in P (none: only its kernels charged)."""
        before, after = mixed_precision_passes([lp.size for lp in self.specs], self.E.e,
                                               self.E.dtype) if self.fp32_grads else ([], [])
        charge_passes(self.E, before)
        if self.opt.needs_global_norm or self.opt.name == "lamb":
            self._clip(G, self._global_norm(G))
        grads = _arrays(G) if P else {}
        if self.opt.name == "adam":
            self._adam(P, grads)
        else:
            self._lamb(P, grads)
        charge_passes(self.E, after)

    def _step_with_experts(self, P: Params, G: Params) -> None:
        """ZeRO-1 with experts reduced apart: both shares' squares summed into one global
        norm (one all-reduce), then each updated with the same clipping."""
        assert self.zero is not None and self.experts is not None
        sq, n = self.zero.squares(P)
        local = self.experts if isinstance(self.experts, list) else []
        if isinstance(self.experts, DistributedAdam):
            esq, en = self.experts.squares(P)
        else:
            en = sum(lp.size for lp in local)
            esq = None if not self.E.on else np.array(
                [sum(float((G[lp.name] ** 2).sum()) for lp in local)])    # type: ignore[operator,misc]
        coeff = 1.0
        if self.opt.needs_global_norm:
            total = None if sq is None or esq is None else sq + esq
            norm = self.norm_of(total, n + en)
            if self.opt.clip_grad_norm > 0 and total is not None:
                coeff = min(1.0, clip_coeff(self.opt, norm))
        self.zero.update(P, coeff)
        if isinstance(self.experts, DistributedAdam):
            self.experts.update(P, coeff)
            return
        if self.E.on and coeff < 1.0:
            for lp in local:
                G[lp.name] = G[lp.name] * coeff                       # type: ignore[operator,assignment]
        before, after = mixed_precision_passes([en], self.E.e, self.E.dtype)
        charge_passes(self.E, before)
        for lp in local:                  # each expert on one rank: Adam in place there
            if self.E.on:
                w = P[lp.name]
                assert w is not None
                w -= self.opt.lr * self._moments(lp.name, w, G[lp.name], lp.decay)  # type: ignore[arg-type]
        self.E.kernel("optim.adam.experts", adam_cost(en))
        charge_passes(self.E, after)

    def _global_norm(self, G: Params) -> float:
        n = sum(lp.size for lp in self.specs)
        sq = None
        if self.E.on:     # TP-split tensors on every rank, replicated ones counted once
            own = [G[lp.name] for lp in self.specs if self.counted(lp)]
            sq = np.array([sum(float((g * g).sum()) for g in own if g is not None)], np.float64)
        return self.norm_of(sq, n)

    def norm_of(self, sq: np.ndarray | None, n: int) -> float:
        """The global norm from this rank's sum of squares over its n gradient elements: the
        squaring kernel (over Adam's fp32 gradients, `mixed_precision_passes`; LAMB's as the
        model holds them), then sqrt of the sums over the norm group (one fp32 all-reduce)."""
        E = self.E
        grad_bytes = MASTER_BYTES if self.fp32_grads else E.e
        E.kernel("optim.grad_norm", Cost(2 * n, n * grad_bytes, MASTER_BYTES), None)
        if self.norm_comm.size == 1:
            return float(np.sqrt(sq[0])) if sq is not None else 0.0
        total = E.all_reduce_scalars(self.norm_comm, "optim.grad_norm.ar", sq, 1, MASTER_BYTES)
        return float(np.sqrt(total[0])) if total is not None else 0.0

    def _clip(self, G: Params, norm: float) -> None:
        if self.opt.clip_grad_norm <= 0 or not self.E.on:
            return
        coeff = clip_coeff(self.opt, norm)
        if coeff < 1.0:
            for k, g in G.items():
                if g is not None:
                    G[k] = g * coeff

    def _moments(self, name: str, w: np.ndarray, g: np.ndarray, decay: bool) -> np.ndarray:
        """Adam's bias-corrected step (plus decoupled weight decay), as the reference."""
        o = self.opt
        m, v = self.m[name], self.v[name]
        assert m is not None and v is not None
        step = adam_direction(o, self.steps, m, v, g)
        if decay and o.weight_decay > 0:
            step = step + o.weight_decay * w
        return step

    def _adam(self, P: dict[str, np.ndarray], G: dict[str, np.ndarray]) -> None:
        math = self.E.on and bool(P)         # none: a skipped step's kernels only
        for _, lps, n in self._layers():
            if math:
                for lp in lps:
                    w = P[lp.name]
                    w -= self.opt.lr * self._moments(lp.name, w, G[lp.name], lp.decay)
            self._charge("adam", lps, adam_cost(n))

    def _parts(self, lp: LocalParam, a: np.ndarray) -> list[np.ndarray]:
        """The pieces of a local tensor that belong to distinct full tensors (Wq|Wk|Wv, the
        gate and the up projection)."""
        return np.split(a, np.cumsum(lp.split)[:-1], axis=-1) if lp.split else [a]

    def _lamb(self, P: dict[str, np.ndarray], G: dict[str, np.ndarray]) -> None:
        E, e = self.E, self.E.e
        math = E.on and bool(P)              # none: a skipped step's kernels only
        copy = e if e < MASTER_BYTES else 0
        steps: dict[str, np.ndarray] = {}
        for _, lps, n in self._layers():                            # stage 1: the update u
            if math:
                for lp in lps:
                    steps[lp.name] = self._moments(lp.name, P[lp.name], G[lp.name], lp.decay)
            self._charge("stage1", lps, Cost(LAMB1_FLOPS * n, n * (e + 3 * MASTER_BYTES),
                                             3 * n * MASTER_BYTES))
        split = [(lp, j) for lp in self.specs if lp.tp_split
                 for j in range(max(1, len(lp.split)))]
        for _, lps, n in self._layers():                            # per-tensor norms
            self._charge("norms", lps, Cost(4 * n, 2 * n * MASTER_BYTES, 0))
        self._reduce_partial_sums()
        sq = None
        if math:
            sq = np.array([float((x * x).sum()) for lp, j in split
                           for x in (self._parts(lp, P[lp.name])[j],
                                     self._parts(lp, steps[lp.name])[j])])
        sq = E.tp_sum("optim.lamb_norms", sq, 2 * len(split), MASTER_BYTES)
        full_sq = {(lp.name, j): (sq[2 * i], sq[2 * i + 1]) for i, (lp, j) in enumerate(split)} \
            if sq is not None else {}
        for _, lps, n in self._layers():                            # stage 2: apply
            if math:
                for lp in lps:
                    self._lamb_apply(lp, P[lp.name], steps[lp.name], full_sq)
            self._charge("stage2", lps, Cost(2 * n, 2 * n * MASTER_BYTES,
                                             n * (MASTER_BYTES + copy)))

    def _lamb_apply(self, lp: LocalParam, w: np.ndarray, step: np.ndarray,
                    full_sq: dict[tuple[str, int], tuple[float, float]]) -> None:
        for j, (wp, sp) in enumerate(zip(self._parts(lp, w), self._parts(lp, step))):
            if lp.tp_split:
                wsq, ssq = full_sq[(lp.name, j)]
            else:
                wsq, ssq = float((wp * wp).sum()), float((sp * sp).sum())
            wn, sn = float(np.sqrt(wsq)), float(np.sqrt(ssq))
            wp -= self.opt.lr * (sp * (wn / sn if wn > 0 and sn > 0 else 1.0))

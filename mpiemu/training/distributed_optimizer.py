"""The distributed optimizer (ZeRO-1, Rajbhandari et al. 2020; Megatron-LM's
DistributedOptimizer): each DP rank holds the fp32 master weights and Adam states of its
contiguous share of every gradient bucket, updates only that share and all-gathers the
parameters afterwards.

The buckets were reduce-scattered during backward (`data_parallel.GradBuckets(shard=True)`), so a
rank starts with its share's summed gradients. The global gradient norm is summed over the
whole job (DP shares are disjoint; replicated tensors count on TP rank 0, the tied table on
the first stage), by the optimizer's own `norm_of`; Adam's arithmetic is
`adam.adam_direction`. The parameter all-gathers run on the DP links after the update; with
`overlap_param_gather` nothing waits for them there: the next forward of a layer waits for
its bucket's gather instead (Megatron-LM --overlap-param-gather).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..comm.collectives import all_gather
from .data_parallel import BucketShard, GradBuckets
from .fully_sharded import ShardedGrads, ShardedParams, fill, wire_itemsize
from .config import OptimizerConfig
from ..model.executor import Executor
from ..model.block import Params
from .adam import (adam_cost, adam_direction, charge_passes, clip_coeff,
                   mixed_precision_passes)
from ..model.tensor_parallel import LocalParam


def _masked_sq(g: Any, mask: np.ndarray) -> float:
    """Sum of squares of the elements of g that the global norm counts."""
    return float((g[mask] ** 2).sum())


class DistributedAdam:
    """Adam on this DP rank's shares of the gradient buckets (numerics and charges)."""

    def __init__(self, opt: OptimizerConfig, specs: list[LocalParam], ex: Executor,
                 buckets: GradBuckets | ShardedGrads,
                 norm_of: Callable[[np.ndarray | None, int], float],
                 counted: Callable[[LocalParam], bool],
                 params: ShardedParams | None = None) -> None:
        self.opt, self.E, self.buckets, self.norm_of = opt, ex, buckets, norm_of
        self.params = params            # ZeRO-3: the shards are the parameters
        self.by_name = {lp.name: lp for lp in specs}
        self.counted = counted
        self.steps = 0
        self.state: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        self.param_ready: dict[int, float] = {}    # layer -> when its parameters are back

    def _masks(self, b: int, sh: BucketShard, dtype: Any
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(m, v, decay mask, norm mask) of bucket b's share, made on first use."""
        if b not in self.state:
            decay = sh.pad(np.concatenate([np.full(self.by_name[n].size, self.by_name[n].decay)
                                           for n in sh.names]))[sh.lo:sh.hi]
            counted = sh.pad(np.concatenate([np.full(self.by_name[n].size,
                                                     self.counted(self.by_name[n]))
                                             for n in sh.names]))[sh.lo:sh.hi]
            z: np.ndarray = np.zeros(sh.hi - sh.lo, dtype)
            self.state[b] = (z, z.copy(), decay, counted)
        return self.state[b]

    def step(self, P: Params) -> None:
        """Clip by the global norm, Adam on the shares, all-gather the parameters."""
        sq, n = self.squares(P)
        coeff = 1.0
        if self.opt.needs_global_norm:
            norm = self.norm_of(sq, n)
            if self.opt.clip_grad_norm > 0 and sq is not None:
                coeff = min(1.0, clip_coeff(self.opt, norm))
        self.update(P, coeff)

    def _on(self) -> bool:
        return self.E.on and all(sh.grad is not None for sh in self.buckets.shards)

    def squares(self, P: Params) -> tuple[np.ndarray | None, int]:
        """(this rank's sum of squares of the gradient elements the norm counts, or None
        timing only; the elements of its shares). The step starts here: Megatron copies each
        parameter's slice of the share to fp32 in its own kernel; the slices differ between
        DP ranks, which folding's symmetry (`comm.folded`) cannot follow, so one copy per
        bucket share stands for them."""
        self.steps += 1
        E, shards = self.E, self.buckets.shards
        n = sum(sh.hi - sh.lo for sh in shards)
        before, _ = mixed_precision_passes([sh.hi - sh.lo for sh in shards], E.e, E.dtype)
        charge_passes(E, before)
        if not (self.opt.needs_global_norm and self._on()):
            return None, n
        dtype = self._dtype(P)
        sq = np.array([sum(_masked_sq(sh.grad, self._masks(b, sh, dtype)[3])
                           for b, sh in enumerate(shards))], np.float64)
        copies = getattr(self.buckets, "copies", 1)
        if copies > 1:          # hybrid sharding: every shard counted once
            sq /= copies
        return sq, n

    def _dtype(self, P: Params) -> Any:
        return next(v for v in P.values() if v is not None).dtype if self._on() else np.float64

    def update(self, P: Params, coeff: float) -> None:
        """Adam on the shares with gradients scaled by `coeff` (clipping); the parameters
        all-gathered after."""
        E, shards = self.E, self.buckets.shards
        on, dtype = self._on(), self._dtype(P)
        n = sum(sh.hi - sh.lo for sh in shards)
        new = [self._update(b, sh, P, coeff, dtype) if on else None
               for b, sh in enumerate(shards)]
        E.kernel("optim.adam", adam_cost(n))
        charge_passes(E, mixed_precision_passes([sh.hi - sh.lo for sh in shards], E.e,
                                                E.dtype)[1])
        if self.params is None:     # ZeRO-3 keeps its shards: each layer gathers when used
            self._gather(P, shards, new)

    def _update(self, b: int, sh: BucketShard, P: Params, coeff: float, dtype: Any
                ) -> np.ndarray:
        """Adam (decoupled weight decay on matrices) on bucket b's share; the new values."""
        o = self.opt
        m, v, decay, _ = self._masks(b, sh, dtype)
        if self.params is not None and sh.unit is not None:
            shard = self.params.shard(sh.unit)
            assert shard is not None
            w = shard                                        # updated in place
        else:
            w = sh.pad(np.concatenate([np.ravel(P[n]) for n in sh.names]))[sh.lo:sh.hi]   # type: ignore[arg-type]
        g: np.ndarray = sh.grad if coeff >= 1.0 else sh.grad * coeff     # type: ignore[assignment,operator]
        step = adam_direction(o, self.steps, m, v, g)
        if o.weight_decay > 0:
            step = np.where(decay, step + o.weight_decay * w, step)
        w -= o.lr * step
        return w

    def _gather(self, P: Params, shards: list[BucketShard], new: list[np.ndarray | None]
                ) -> None:
        """All-gather every bucket's parameters over DP, in bucket order, on the DP links."""
        E, dp = self.E, self.buckets.dp
        t, end = E.t, E.t
        for b, (sh, w) in enumerate(zip(shards, new)):
            wire = wire_itemsize((self.by_name[n] for n in sh.names), E.e,
                                 self.opt.fp8_param_gather)
            full, span = all_gather(dp, w, total=sh.padded, after=t, wire_itemsize=wire,
                                    unit=1, label=f"dp.param_gather{b}")
            end = max(end, span.t_end)
            for name in sh.names:
                layer = self.by_name[name].layer
                self.param_ready[layer] = max(self.param_ready.get(layer, 0.0), span.t_end)
            if full is not None:
                fill(P, sh.names, full)
        if not self.opt.overlap_param_gather:
            E.wait_until(end)
            self.param_ready.clear()

"""Data-parallel gradient reduction in buckets, issued as gradients become ready.

Backward produces weight gradients layer by layer, last layer first; once a bucket's worth
is final it is all-reduced on the DP ring while backward goes on (thesis 4.5.1: layer L's
gradient all-reduce overlaps layer L-1's gradient computation; PyTorch DDP / Megatron
buckets). The collective runs on the `comm.dp` / `link.dp.*` streams, so in emulated time it
overlaps the compute stream; the optimizer waits for every bucket (`finish`). With the
distributed optimizer (`shard`, ZeRO-1; Megatron-LM's DistributedOptimizer) each bucket is
reduce-scattered instead: a DP rank keeps its contiguous share of the bucket's summed
gradients (`BucketShard`), updates those parameters only and all-gathers them afterwards;
each such bucket is padded with zeros to a multiple of lcm(DP size, 128) elements, as
Megatron-LM pads them for uniform sharding (megatron/core/distributed/
param_and_grad_buffer.py, `_pad_end_of_bucket_if_needed`).

Averaging over DP (`train.ddp`, with Megatron-LM's gradient buffer only, `training.grad_buffer`):
`core`, Megatron core's DDP, scales each bucket by 1/DP on the compute stream just before its
reduction when DP > 1 (param_and_grad_buffer.py, `start_grad_sync`: `bucket.grad_data *=
bucket.gradient_scaling_factor` unless it is 1; `average_in_collective` is off by default);
`local`, Megatron-LM's local DDP of 2022 (megatron/model/distributed.py at de593298,
`allreduce_gradients`), divides the whole buffer by the DP size after backward, even at
DP 1, then reduces it in one call: `gradients.StageGradients` charges that kernel and sizes
one bucket.
The payload is not scaled: the loss is already the global batch's mean.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..comm.p2p import TimedComm
from ..comm.collectives import all_reduce, own_range, reduce_scatter
from ..comm.ring import Reduction
from ..sim.timeline import Span
from ..model.executor import Array



@dataclass
class BucketShard:
    """One bucket under the distributed optimizer: its tensors, in order, and this DP
    rank's element range [lo, hi) of their concatenation padded to `padded` elements, with
    its summed gradients."""

    names: list[str]
    count: int
    lo: int
    hi: int
    grad: Array
    padded: int
    unit: int | None = None         # ZeRO-2 / 3: the layer unit it is (`fully_sharded`)

    def pad(self, a: np.ndarray) -> np.ndarray:
        """A concatenation of the bucket's count elements, zero-padded to `padded`."""
        return zero_padded(a, self.padded)


def padded_count(count: int, dp: int) -> int:
    """A sharded bucket's length: count rounded up to a multiple of lcm(dp, 128)."""
    q = math.lcm(dp, 128)
    return -(-count // q) * q


def zero_padded(a: np.ndarray, n: int) -> np.ndarray:
    """The flat array a followed by zeros up to n elements."""
    return np.concatenate([a, np.zeros(n - a.size, a.dtype)])


@dataclass
class GradBuckets:
    """Collects ready gradients; reduces a bucket once it holds `bucket_bytes`."""

    dp: TimedComm
    itemsize: int                        # emulated bytes per gradient element
    bucket_bytes: float
    sizes: dict[str, int]                # elements of every local parameter
    bidirectional: bool = False
    shard: bool = False                  # reduce-scatter (ZeRO-1) instead of all-reduce
    overlap: bool = True                 # reduce during backward (else all after it)
    # charges a bucket's 1/DP scaling kernel (label, elements) on the compute stream and
    # returns when it ends; None: nothing scales (no gradient buffer, or `local` DDP)
    prescale: Callable[[str, int], float] | None = None
    reduce_s: Reduction = field(kw_only=True)      # the device's time to reduce (its cost)
    spans: list[Span] = field(default_factory=list)
    shards: list[BucketShard] = field(default_factory=list)
    _names: list[str] = field(default_factory=list)
    _t_ready: float = 0.0

    def ready(self, names: list[str], grads: dict[str, Array], t: float) -> None:
        """Gradients `names` are final at emulated time t (data ready for the bucket)."""
        if self.dp.size == 1:
            return
        self._names.extend(names)
        self._t_ready = max(self._t_ready, t)
        if self.overlap and self._full(self._names):
            self._flush(grads)

    def _full(self, names: list[str]) -> bool:
        return sum(self.sizes[n] for n in names) * self.itemsize >= self.bucket_bytes

    def _flush(self, grads: dict[str, Array]) -> None:
        if not self._names:
            return
        names, self._names = self._names, []
        count = sum(self.sizes[n] for n in names)
        flat = None
        if all(grads.get(n) is not None for n in names):
            flat = np.concatenate([np.ravel(grads[n]) for n in names])   # type: ignore[arg-type]
        label = f"dp.bucket{len(self.spans)}"
        if self.prescale is not None:   # scaled on the compute stream, then reduced
            self._t_ready = max(self._t_ready, self.prescale(f"{label}.scale", count))
        if self.shard:
            padded = padded_count(count, self.dp.size)
            if flat is not None:
                flat = zero_padded(flat, padded)
            out, span = reduce_scatter(self.dp, flat, reduce_s=self.reduce_s,
                                       after=self._t_ready, count=padded,
                                       wire_itemsize=self.itemsize, unit=1, label=label,
                                       bidirectional=self.bidirectional)
            lo, hi = own_range(padded, self.dp.size, self.dp.rank)
            self.shards.append(BucketShard(names, count, lo, hi, out, padded))
            self.spans.append(span)
            return
        out, span = all_reduce(self.dp, flat, reduce_s=self.reduce_s, after=self._t_ready,
                               count=count, wire_itemsize=self.itemsize,
                               bidirectional=self.bidirectional, label=label)
        self.spans.append(span)
        if out is not None:
            offset = 0
            for n in names:
                g = grads[n]
                assert g is not None
                grads[n] = out[offset:offset + g.size].reshape(g.shape)
                offset += g.size

    def finish(self, grads: dict[str, Array], t: float) -> float:
        """All-reduce what is left; the time every bucket is done (or t with dp = 1)."""
        if self.dp.size == 1:
            return t
        self._t_ready = max(self._t_ready, t)
        pending, self._names = self._names, []
        for n in pending:                 # without overlap: the same buckets, from now on
            self._names.append(n)
            if self._full(self._names):
                self._flush(grads)
        self._flush(grads)
        return max([t] + [s.t_end for s in self.spans])

    def reset(self) -> None:
        self.spans.clear()
        self.shards.clear()
        self._names.clear()
        self._t_ready = 0.0

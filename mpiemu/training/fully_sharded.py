"""ZeRO-2 and ZeRO-3 / FSDP: gradients, and parameters, sharded over DP one layer at a time.

Sharding unit (`Unit`): one transformer layer, or the stage's embedding and head tensors
(key -1), as PyTorch FSDP2 wraps each block and the root (torchtitan `apply_fsdp`). A
unit's tensors are flattened in order and zero-padded to a multiple of lcm(DP, 128)
elements; DP rank r owns the contiguous range `own_range` of it (Megatron-FSDP and FSDP's
flat parameter: rank r holds shard r).

Gradients (`ShardedGrads`, ZeRO-2 and 3; Rajbhandari et al. 2020, 5.2): once a micro-
batch's backward has produced every gradient of a unit, the unit's gradient is reduce-
scattered over DP on the DP links while backward goes on, added into the rank's shard and
freed (FSDP reduce-scatters every micro-batch: there is no full gradient to accumulate in).
Gradients of parameters that saw only the rank's sequence rows (SP) are first summed over
TP (`partial`).

Hybrid sharding (PyTorch HSDP, torchtitan's dp_replicate x dp_shard): the shard group is a
block of consecutive DP ranks (a node's); each unit is reduce-scattered inside it and the
shard then all-reduced across the groups (`replicas`); parameters gather inside it.

Parameters (`ShardedParams`, ZeRO-3, 5.3): between uses a unit holds only its shard; before
a pass uses it its parameters are all-gathered over DP (`need`), and with `prefetch` the
unit the pass uses next is gathered meanwhile, under the current unit's compute (FSDP's
forward and backward prefetch: start -> compute -> wait). After backward a unit is freed
again, and after forward too when `reshard_after_forward` (else it stays gathered until its
backward, FSDP2 `reshard_after_forward=False`); the embedding and head unit (-1) stays
gathered through forward, as FSDP's root. A freed unit's arrays are filled with NaN in a
numerics run, so any use of a parameter that was not gathered shows in the result.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np

from ..comm.collectives import all_gather, all_reduce, own_range, reduce_scatter
from ..comm.p2p import TimedComm
from ..comm.ring import Reduction
from ..model.block import Params
from ..model.executor import Array, Executor
from ..model.tensor_parallel import LocalParam
from ..sim.timeline import SimTime, Span
from .data_parallel import BucketShard, padded_count, zero_padded


@dataclass(frozen=True)
class Unit:
    """One layer's tensors (key -1: embedding and head), flattened and padded to `padded`;
    this rank's shard is [lo, hi)."""

    key: int
    names: tuple[str, ...]
    count: int
    padded: int
    lo: int
    hi: int


def units(specs: list[LocalParam], dp: TimedComm) -> dict[int, Unit]:
    """The stage's sharding units by key, in the order of the specs."""
    keys: dict[int, list[LocalParam]] = {}
    for lp in specs:
        keys.setdefault(lp.layer, []).append(lp)
    out = {}
    for key, lps in keys.items():
        count = sum(lp.size for lp in lps)
        padded = padded_count(count, dp.size)
        lo, hi = own_range(padded, dp.size, dp.rank)
        out[key] = Unit(key, tuple(lp.name for lp in lps), count, padded, lo, hi)
    return out


def hybrid(dp: TimedComm, group: int) -> tuple[TimedComm, TimedComm | None]:
    """(shard group, replica group) of this rank: blocks of `group` consecutive ranks of
    `dp`, and the ranks at the same place in every block (None: one group spans dp)."""
    if group in (0, dp.size):
        return dp, None
    return (dp.split("shard", lambda r: r // group),
            dp.split("replica", lambda r: r % group))


def flat(u: Unit, arrays: Params) -> np.ndarray | None:
    """The unit's tensors concatenated and zero-padded (None on shapes alone)."""
    if any(arrays.get(n) is None for n in u.names):
        return None
    return zero_padded(np.concatenate([np.ravel(arrays[n]) for n in u.names]),  # type: ignore[arg-type]
                       u.padded)


@dataclass
class ShardedGrads:
    """ZeRO-2 / 3 gradients: each unit reduce-scattered per micro-batch into its shard
    (`shards`, the optimizer's input, in the order units first complete)."""

    dp: TimedComm
    itemsize: int                        # emulated bytes per gradient element
    units: dict[int, Unit]
    layer_of: dict[str, int]
    reduce_s: Reduction
    bidirectional: bool = False
    # sums over TP the gradients among `names` that saw the rank's sequence rows only (SP)
    partial: Callable[[list[str]], None] | None = None
    replicas: TimedComm | None = None    # hybrid sharding: the same shard on other groups
    group: str = "dp"                    # the group's name in event labels (experts: edp)
    spans: list[Span] = field(default_factory=list)
    shards: list[BucketShard] = field(default_factory=list)
    _pending: dict[int, set[str]] = field(default_factory=dict)
    _by_unit: dict[int, BucketShard] = field(default_factory=dict)

    def ready(self, names: list[str], grads: Params, t: SimTime) -> None:
        """Gradients `names` of one micro-batch are computed at t: reduce each unit that
        is now complete."""
        for n in names:
            key = self.layer_of[n]
            left = self._pending.setdefault(key, set(self.units[key].names))
            left.discard(n)
            if not left:
                del self._pending[key]
                self._reduce(self.units[key], grads, t)

    def _reduce(self, u: Unit, grads: Params, t: SimTime) -> None:
        if self.partial is not None:
            self.partial(list(u.names))
        g = flat(u, grads)
        out, span = reduce_scatter(self.dp, g, reduce_s=self.reduce_s, after=t,
                                   count=u.padded, wire_itemsize=self.itemsize, unit=1,
                                   label=f"{self.group}.grad_rs.L{u.key}",
                                   bidirectional=self.bidirectional)
        if self.replicas is not None:     # hybrid: the shard's sum over the replicas too
            out, span = all_reduce(self.replicas, out, reduce_s=self.reduce_s,
                                   after=span.t_end, count=u.hi - u.lo,
                                   wire_itemsize=self.itemsize,
                                   bidirectional=self.bidirectional,
                                   label=f"dp.grad_ar.L{u.key}")
        self.spans.append(span)
        for n in u.names:           # the whole gradient is freed: the shard keeps the sum
            grads[n] = None
        sh = self._by_unit.get(u.key)
        if sh is None:
            sh = self._by_unit[u.key] = BucketShard(list(u.names), u.count, u.lo, u.hi, out,
                                                    u.padded, unit=u.key)
            self.shards.append(sh)
        elif out is not None and sh.grad is not None:
            sh.grad += out

    @property
    def copies(self) -> int:
        """How many ranks hold each shard (a global norm over every rank counts it so often)."""
        return 1 if self.replicas is None else self.replicas.size

    def finish(self, grads: Params, t: SimTime) -> SimTime:
        """When every reduction of the step is done (t when there are none)."""
        return max([t] + [s.t_end for s in self.spans])

    def reset(self) -> None:
        self.spans.clear()
        self.shards.clear()
        self._pending.clear()
        self._by_unit.clear()


def fill(P: Params, names: Sequence[str], flat: np.ndarray) -> None:
    """The tensors `names` of P overwritten, in order, from consecutive slices of `flat`."""
    offset = 0
    for n in names:
        p = P[n]
        assert p is not None
        p[...] = flat[offset:offset + p.size].reshape(p.shape)
        offset += p.size


def wire_itemsize(params: Iterable[LocalParam], e: int, fp8: bool) -> float:
    """Bytes per element an all-gather of these parameters' concatenation moves: the
    emulated dtype's; under `fp8_param_gather` a layer's linear weights travel as FP8, one
    byte (Megatron-Core keeps them in a uint8 buffer of their own; ASSUMPTION: one gather of
    the mixed bytes stands for the two buffers' gathers)."""
    ps = list(params)
    n = sum(p.size for p in ps)
    if not fp8 or n == 0:
        return e
    return sum(p.size * (1 if fp8_param(p) else e) for p in ps) / n


def fp8_param(lp: LocalParam) -> bool:
    """A transformer layer's linear weight (what an FP8 recipe casts)."""
    return lp.layer >= 0 and len(lp.shape) == 2 and not lp.expert


class ShardedParams:
    """ZeRO-3 parameters: each unit's shard between uses, gathered over DP when a pass
    needs it (`need`), freed after (`done`); `wire`: each unit's bytes per element on the
    wire (`wire_itemsize`)."""

    def __init__(self, P: Params, units: dict[int, Unit], ex: Executor, dp: TimedComm, *,
                 prefetch: bool, reshard_after_forward: bool,
                 wire: dict[int, float] | None = None, group: str = "dp") -> None:
        self.P, self.units, self.E, self.dp = P, units, ex, dp
        self.wire, self.group = wire or {}, group
        self.prefetch, self.reshard_after_forward = prefetch, reshard_after_forward
        self.shards: dict[int, Array] = {}
        for key, u in units.items():
            f = flat(u, P)
            self.shards[key] = None if f is None else f[u.lo:u.hi].copy()
            self._free(u)
        self.ready: dict[int, SimTime] = {}      # gathered units: when their gather ends

    def need(self, key: int, upcoming: int | None) -> None:
        """The pass uses unit `key` now: wait for its gather (issued now if not yet); then
        start the gather of the unit used next, which runs under this unit's compute (a key
        without a unit here: nothing)."""
        if key not in self.units:
            return
        upcoming = upcoming if upcoming in self.units else None
        if key not in self.ready:
            self._gather(key)
        self.E.wait_until(self.ready[key])
        if self.prefetch and upcoming is not None and upcoming not in self.ready:
            self._gather(upcoming)

    def done(self, key: int, backward: bool) -> None:
        """The pass is done with unit `key`: free it after backward, and after forward when
        resharding (never the embedding and head's: it stays for the head and backward)."""
        if key in self.units and (backward or (self.reshard_after_forward and key != -1)):
            self.ready.pop(key, None)
            self._free(self.units[key])

    def shard(self, key: int) -> Array:
        """The rank's shard of unit `key` (the optimizer updates it in place)."""
        return self.shards[key]

    def unshard(self) -> None:
        """Every unit's parameters gathered into the model's arrays, outside emulated time
        (the run's checks read whole parameters after the last step)."""
        for key, u in self.units.items():
            shard = self.shards[key]
            if shard is None:
                continue
            fill(self.P, u.names, np.concatenate(self.dp.comm.allgather(shard)))

    def _gather(self, key: int) -> None:
        u = self.units[key]
        full, span = all_gather(self.dp, self.shards[key], total=u.padded, after=self.E.t,
                                wire_itemsize=self.wire.get(key, self.E.e), unit=1,
                                label=f"{self.group}.param_ag.L{key}")
        self.ready[key] = span.t_end
        if full is not None:
            fill(self.P, u.names, full)

    def _free(self, u: Unit) -> None:
        for n in u.names:
            p = self.P[n]
            if p is not None:
                p[...] = np.nan

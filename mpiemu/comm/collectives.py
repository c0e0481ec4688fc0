"""Reduce-scatter, all-gather and all-reduce on numpy buffers, timed by the network layer.

Each call pays the network's base latency for its protocol (NCCL's baseLat: launch and
setup, independent of the number of steps) and then runs its algorithm:

* `ring` (`comm.ring`): every collective, on one lane, two (bidirectional) or one per rail
  when the group spans nodes;
* `hierarchical` (all-reduce across nodes): reduce-scatter inside each node, all-reduce of
  each shard on its rail ring across nodes, all-gather inside each node (sub-communicators
  split once and cached), pipelined over up to 8 segments;
* `tree` (all-reduce across nodes, `comm.tree`): NCCL's double binary tree, a chain inside
  each node, pipelined over up to 8 segments;
* `nvls` (all-reduce inside one NVSwitch node with NVLink SHARP): the switch reduces once
  the last member's data is ready (the members exchange their ready times); each device's
  two ports carry S (N+1)/N at the NVLS rate (`net.message.switch_reduce`). The payload's
  sum is MPI's own `Allreduce`, standing for the switch's arithmetic.

The (algorithm, protocol) pair is the one with the lowest predicted time (`comm.cost`, as
NCCL's tuner chooses), unless the communicator's `tuning` (from `[collectives]`) names one;
the choice travels with the call's messages as a `Call`. `reduce_s` is the device's time to
reduce (`DeviceCost.reduction_s`): the reductions run on the device the rank plays.
Passing `x=None` runs the same schedule on sizes alone (timing-only mode).
"""
from __future__ import annotations

import math

import numpy as np
from mpi4py import MPI

from ..net.message import switch_reduce
from ..sim.timeline import SimTime, Span, latest
from .cost import choose, estimate_s, nvls_tree_depth, pipeline_depth, tree_depth
from .folded import FoldError, FoldedComm
from .nvls_tree import nvls_tree_all_reduce
from .p2p import Call, TimedComm
from .ring import (AllGather, PlainGather, PlainReduce, Reduction, ReduceScatter, ring_lanes,
                   ring_pieces)
from .lanes import Lane, Piece, chunk_bounds
from .tree import tree_all_reduce
from .tuner import Choice, node_groups

__all__ = ["all_gather", "all_reduce", "all_reduce_scalars", "call_for", "chunk_bounds",
           "reduce_scatter"]


def _size(x: np.ndarray | None, count: int | None) -> int:
    if x is not None:
        return int(x.size)
    if count is None or count < 0:
        raise ValueError(f"timing-only collectives need count >= 0, got {count}")
    return count


def _itemsize(x: np.ndarray | None, wire_itemsize: float | None) -> float:
    if wire_itemsize is not None:
        return wire_itemsize
    return x.itemsize if x is not None else 4


def _unit(x: np.ndarray | None, unit: int | None) -> int:
    """Elements per indivisible row: a multi-dim array is scattered along its first axis."""
    if unit is not None:
        return unit
    if x is None or x.ndim <= 1:
        return 1
    return math.prod(x.shape[1:])


def _out(out: np.ndarray | None, n: int, dtype: np.dtype) -> np.ndarray:
    """The caller's output buffer (checked) or a new one."""
    if out is None:
        return np.empty(n, dtype)
    if out.size != n or out.dtype != dtype or not out.flags.c_contiguous:
        raise ValueError(f"out must be a contiguous {dtype} array of {n} elements, got "
                         f"{out.dtype} with {out.size}")
    return out.reshape(-1)


def call_for(tc: TimedComm, op: str, nbytes: float, itemsize: float,
             bidirectional: bool = False) -> tuple[Choice, Call]:
    """The (algorithm, protocol) NCCL's tuner picks for this call (or the communicator's
    tuning names) and the call its messages run as: that protocol, the channel share NCCL
    gives a call of this size, that algorithm's hop latencies."""
    ch = choose(tc, op, nbytes, itemsize, tc.tuning.algorithm if op == "all_reduce" else "",
                tc.tuning.protocol, bidirectional)
    return ch, Call(ch.protocol, tc.net.spec.channel_share(ch.protocol, nbytes, tc.size),
                    ch.algorithm)


def _start(tc: TimedComm, op: str, nbytes: float, itemsize: float, bidirectional: bool,
           t0: SimTime) -> tuple[Choice, Call, SimTime]:
    """The call (`call_for`), checked against folding; its base latency paid."""
    ch, call = call_for(tc, op, nbytes, itemsize, bidirectional)
    if isinstance(tc.comm, FoldedComm) and ch.algorithm not in tc.comm.algorithms:
        raise FoldError(f"run.fold: the {tc.name} group runs {op} of {int(nbytes)} bytes "
                        f"with NCCL's {ch.algorithm} algorithm, whose ranks differ, so "
                        "folding would not be exact; run with run.fold = \"off\" (or "
                        "collectives.algorithm = \"ring\")")
    return ch, call, t0 + tc.net.spec.base(ch.algorithm, ch.protocol)


def _record(tc: TimedComm, label: str, span: Span, nbytes: float, ch: Choice) -> None:
    """The call's summary event, and the SMs its kernel holds from issue to end (one block
    per channel, `NetworkSpec.kernel_blocks`): a GEMM meanwhile runs on the rest."""
    tc.tl.summary(label, span, resource=f"coll.{tc.name}", nbytes=round(nbytes))
    tc.tl.sms.hold(span.t_start, span.t_end,
                   tc.net.spec.kernel_blocks(ch.algorithm, ch.protocol, nbytes, tc.size))


def _own(n: int, unit: int, size: int, rank: int) -> tuple[int, int]:
    lo, hi = chunk_bounds(n // unit, size)[rank]
    return lo * unit, hi * unit


def own_range(n: int, size: int, rank: int) -> tuple[int, int]:
    """The elements [lo, hi) of n that `reduce_scatter` leaves on `rank` (and `all_gather`
    expects from it)."""
    return _own(n, 1, size, rank)


def _rows(a: np.ndarray | None, unit: int) -> np.ndarray | None:
    return None if a is None else a.reshape(-1, unit)    # [n] -> [n / unit, unit]


def _ring_plan(tc: TimedComm, m: int, bidirectional: bool, kind: str
               ) -> tuple[list[Lane], list[Piece]]:
    """Lanes and this rank's pieces of a plain ring over m rows (remembered per group)."""
    return ring_lanes(tc, m, bidirectional), ring_pieces(tc, m, bidirectional, 1, kind)


def _ring_rs(tc: TimedComm, call: Call, reduce_s: Reduction, flat: np.ndarray | None, n: int,
             itemsize: float, unit: int, bidirectional: bool, t: SimTime,
             out: np.ndarray | None, out_lo: int) -> SimTime:
    """The plain ring reduce-scatter; chunk `rank`'s sum goes to out (element out_lo on)."""
    ls, pieces = _ring_plan(tc, n // unit, bidirectional, "rs")
    hooks = PlainReduce(tc, call, reduce_s, ls, unit, itemsize, t, _rows(flat, unit))
    run = ReduceScatter(tc, ls, pieces, unit, itemsize, hooks,
                        dtype=None if flat is None else flat.dtype, out=_rows(out, unit),
                        own_lo=out_lo // unit).run()
    return run.done


def _ring_ag(tc: TimedComm, call: Call, buf: np.ndarray | None, n: int, itemsize: float,
             unit: int, bidirectional: bool, t: SimTime) -> SimTime:
    """The plain ring all-gather in place (buf holds this rank's chunk)."""
    ls, pieces = _ring_plan(tc, n // unit, bidirectional, "ag")
    hooks = PlainGather(tc, call, t)
    return AllGather(tc, ls, pieces, unit, itemsize, hooks,
                     _rows(buf, unit)).run().end


def _ring_ar(tc: TimedComm, call: Call, reduce_s: Reduction, flat: np.ndarray | None,
             buf: np.ndarray | None, n: int, itemsize: float, unit: int, bidirectional: bool,
             t: SimTime) -> SimTime:
    """Ring all-reduce = reduce-scatter then all-gather on the same chunks, 2(N-1) steps."""
    if tc.size == 1:
        if buf is not None and flat is not None:
            buf[:] = flat
        return t
    t = _ring_rs(tc, call, reduce_s, flat, n, itemsize, unit, bidirectional, t, buf, 0)
    return _ring_ag(tc, call, buf, n, itemsize, unit, bidirectional, t)


def _hierarchical_ar(tc: TimedComm, call: Call, reduce_s: Reduction,
                     flat: np.ndarray | None, buf: np.ndarray | None, n: int, itemsize: float,
                     unit: int, t: SimTime) -> SimTime:
    """Intra-node reduce-scatter, rail all-reduce of the shard, intra-node all-gather, on
    `pipeline_depth` segments: every segment's reduce-scatters are issued first, then the
    rail all-reduces, then the all-gathers, each ready when its segment's previous phase
    is; the ports' calendars let segment k+1 cross NVLink while segment k is on the NICs
    (as NCCL's tree pipelines its chain and its inter-node tree)."""
    intra, rail = tc.hierarchy()
    ring = call._replace(algorithm="ring")      # each phase: a ring with the call's protocol
    segs = [(a * unit, b * unit) for a, b in chunk_bounds(n // unit,
                                                          pipeline_depth(n * itemsize))]

    def view(x: np.ndarray | None, a: int, b: int) -> np.ndarray | None:
        return None if x is None else x[a:b]
    ends = [_ring_rs(intra, ring, reduce_s, view(flat, a, b), b - a, itemsize, unit, False, t,
                     view(buf, a, b), 0) for a, b in segs]
    for i, (a, b) in enumerate(segs):
        lo, hi = (a + o for o in _own(b - a, unit, intra.size, intra.rank))
        shard = None if buf is None else buf[lo:hi].copy()
        ends[i] = _ring_ar(rail, ring, reduce_s, shard, view(buf, lo, hi), hi - lo, itemsize,
                           unit, False, ends[i])
    return max(_ring_ag(intra, ring, view(buf, a, b), b - a, itemsize, unit, False, ends[i])
               for i, (a, b) in enumerate(segs))


def reduce_scatter(tc: TimedComm, x: np.ndarray | None, *, reduce_s: Reduction,
                   after: SimTime = 0.0, count: int | None = None,
                   wire_itemsize: float | None = None,
                   bidirectional: bool = False, label: str = "reduce_scatter",
                   out: np.ndarray | None = None, unit: int | None = None
                   ) -> tuple[np.ndarray | None, Span]:
    """Sum x over the group and keep chunk `rank` of the result (rows of a 2-D x).

    forward: reduce-scatter; its conjugate (backward) is `all_gather`.
    """
    n, itemsize, t0 = _size(x, count), _itemsize(x, wire_itemsize), latest(after)
    u = _unit(x, unit)
    if tc.size == 1:
        return (None if x is None else x.copy()), Span(t0, t0)
    flat = None if x is None else np.ascontiguousarray(x).reshape(-1)
    lo, hi = _own(n, u, tc.size, tc.rank)
    res = None if flat is None else _out(out, hi - lo, flat.dtype)
    ch, call, t = _start(tc, "reduce_scatter", n * itemsize, itemsize, bidirectional, t0)
    span = Span(t0, _ring_rs(tc, call, reduce_s, flat, n, itemsize, u, bidirectional, t, res,
                             lo))
    _record(tc, label, span, n * itemsize, ch)
    if res is not None and x is not None and x.ndim > 1:
        res = res.reshape(-1, *x.shape[1:])
    return res, span


def all_gather(tc: TimedComm, x: np.ndarray | None, *, total: int | None = None,
               after: SimTime = 0.0, count: int | None = None,
               wire_itemsize: float | None = None, bidirectional: bool = False,
               label: str = "all_gather", out: np.ndarray | None = None,
               unit: int | None = None) -> tuple[np.ndarray | None, Span]:
    """Concatenate every rank's chunk in rank order (rows of a 2-D x; `total` elements).

    forward: all-gather; its conjugate (backward) is `reduce_scatter`.
    """
    itemsize, t0 = _itemsize(x, wire_itemsize), latest(after)
    n = total if total is not None else _size(x, count) * tc.size
    u = _unit(x, unit)
    if tc.size == 1:
        return (None if x is None else x.copy()), Span(t0, t0)
    lo, hi = _own(n, u, tc.size, tc.rank)
    buf = None
    if x is not None:
        if x.size != hi - lo:
            raise ValueError(f"all_gather: rank {tc.rank} holds {x.size} elements but chunk "
                             f"{tc.rank} of {n} has {hi - lo}")
        buf = _out(out, n, x.dtype)
        buf[lo:hi] = x.reshape(-1)
    ch, call, t = _start(tc, "all_gather", n * itemsize, itemsize, bidirectional, t0)
    span = Span(t0, _ring_ag(tc, call, buf, n, itemsize, u, bidirectional, t))
    _record(tc, label, span, n * itemsize, ch)
    if buf is not None and x is not None and x.ndim > 1:
        buf = buf.reshape(-1, *x.shape[1:])
    return buf, span


def all_reduce(tc: TimedComm, x: np.ndarray | None, *, reduce_s: Reduction,
               after: SimTime = 0.0, count: int | None = None,
               wire_itemsize: float | None = None,
               bidirectional: bool = False, label: str = "all_reduce",
               out: np.ndarray | None = None, unit: int = 1
               ) -> tuple[np.ndarray | None, Span]:
    """Sum x over the group on every rank (ring: RS then AG; or hierarchical across nodes).

    Its own conjugate: the backward of an all-reduce is an all-reduce.
    """
    n, itemsize, t0 = _size(x, count), _itemsize(x, wire_itemsize), latest(after)
    if tc.size == 1:
        return (None if x is None else x.copy()), Span(t0, t0)
    flat = None if x is None else np.ascontiguousarray(x).reshape(-1)
    buf = None if flat is None else _out(out, n, flat.dtype)
    ch, call, t = _start(tc, "all_reduce", n * itemsize, itemsize, bidirectional, t0)
    if ch.algorithm == "hierarchical":
        end = _hierarchical_ar(tc, call, reduce_s, flat, buf, n, itemsize, unit, t)
    elif ch.algorithm == "tree":
        groups = node_groups(tc.net, tc.devices)
        end = tree_all_reduce(tc, call, reduce_s, groups, flat, buf, n, itemsize, t,
                              tree_depth(n * itemsize, len(groups[0])))
    elif ch.algorithm == "nvls_tree":
        end = nvls_tree_all_reduce(tc, call, reduce_s, flat, buf, n, itemsize, t,
                                   nvls_tree_depth(n * itemsize, tc.net.per_node))
    elif ch.algorithm == "nvls":
        # the switch reduces every member's chunk and multicasts the sum: no member holds
        # it before the last member's data is in (NCCL's NVLS kernel waits for its peers)
        t = float(tc.comm.allreduce(t, op=MPI.MAX))
        if flat is not None:
            tc.comm.Allreduce(flat, buf)
        end = switch_reduce(tc.tl, tc.net, tc.device, n * itemsize, t, label="nvls")
    else:
        end = _ring_ar(tc, call, reduce_s, flat, buf, n, itemsize, unit, bidirectional, t)
    span = Span(t0, end)
    _record(tc, label, span, n * itemsize, ch)
    return (None if buf is None else buf.reshape(x.shape)), span  # type: ignore[union-attr]


def all_reduce_scalars(tc: TimedComm, x: np.ndarray | None, *, reduce_s: Reduction,
                       after: SimTime = 0.0, count: int = 1, wire_itemsize: float | None = None,
                       label: str = "all_reduce") -> tuple[np.ndarray | None, Span]:
    """Sum a few scalars (a gradient norm) over the group as one latency-bound call: every
    member leaves at the tuner's estimate of the call (`comm.cost.estimate_s`, base latency
    included) after the last member entered. NCCL runs it as one LL kernel that no member
    can leave before every contribution is in; its 2(N-1) tiny ring messages are not
    emulated one by one. Members leaving together keeps a folded run's images exact."""
    n, itemsize, t0 = _size(x, count), _itemsize(x, wire_itemsize), latest(after)
    if tc.size == 1:
        return (None if x is None else x.copy()), Span(t0, t0)
    ch = choose(tc, "all_reduce", n * itemsize, itemsize, tc.tuning.algorithm,
                tc.tuning.protocol)
    t_last = float(tc.comm.allreduce(t0, op=MPI.MAX))
    end = t_last + estimate_s(tc, "all_reduce", n * itemsize, itemsize, ch, reduce_s)
    out = None
    if x is not None:
        out = np.empty_like(x)
        tc.comm.Allreduce(np.ascontiguousarray(x), out)
    span = Span(t0, end)
    _record(tc, label, span, n * itemsize, ch)
    return out, span

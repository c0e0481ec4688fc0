"""Emulated time of a transformer layer on a Sunway rank: SwFormer's CG schedule plus the TP
all-reduces, placed group by group (SWF App. A.2 and C; SWA 3.1).

The layer's ops (`devices/sunway/layer.py`) are scheduled once per pass under the policy
(intra-op, OPT2 or KA); here the task groups are replayed in order on the `cgK` streams of
the timeline, each starting when the queue has drained and its inputs exist. The TP
all-reduce after `proj` and `fc2` (forward) and after `fc1.d` and `qkv.d` (backward) runs
on the links while independent groups keep the CGs busy; the op that consumes its result
waits for it. Weight gradients are handed to the DP buckets when their GEMM ends.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..comm.collectives import all_reduce
from ..devices.sunway.layer import LayerShape, layer_ops
from ..devices.sunway.cost import SunwayModel
from ..devices.sunway.schedule import Op, Placement, Schedule
from ..sim.timeline import COMPUTE, SimTime, Span
from .gpu import Dims, Engine, Ready, no_ready
from ..model.swattention import cg_resource

# op that consumes a TP all-reduce -> op whose output is all-reduced (Megatron, thesis 4.5.1)
AFTER_ALL_REDUCE = {"fwd": {"res1": "proj", "res2": "fc2"},
                    "bwd": {"ln2.b": "fc1.d", "ln1.b": "qkv.d"}}
# backward op -> the parameters whose gradients are final when it ends
GRADS_READY = {"fc2.w": ("fc2.w", "fc2.b"), "fc1.w": ("fc1.w", "fc1.b"),
               "proj.w": ("proj.w", "proj.b"), "qkv.w": ("qkv.w", "qkv.b"),
               "ln2.b": ("ln2.g", "ln2.b"), "ln1.b": ("ln1.g", "ln1.b")}


@dataclass(frozen=True)
class SunwayLayerPlan:
    """The CG schedules of one layer's forward and backward on this rank (same every layer)."""

    ops: dict[str, tuple[Op, ...]]
    schedules: dict[str, Schedule]
    policy: str

    @classmethod
    def build(cls, model: SunwayModel, dims: Dims, dtype: str, policy: str,
              attention: str) -> "SunwayLayerPlan":
        shape = LayerShape(hidden=dims.hidden, heads=dims.heads * dims.tp,
                           head_dim=dims.head_dim, ffn=dims.ffn * dims.tp, seq=dims.seq,
                           batch=dims.batch, tp=dims.tp, dtype=dtype)
        ops = {p: tuple(layer_ops(model, shape, p, attention)) for p in ("fwd", "bwd")}
        return cls(ops, {p: model.schedule(list(ops[p]), policy) for p in ops}, policy)


def _groups(sched: Schedule) -> list[list[Placement]]:
    by: dict[int, list[Placement]] = {}
    for p in sched.placements:
        by.setdefault(p.group, []).append(p)
    return [by[g] for g in sorted(by)]


def charge_pass(E: Engine, plan: SunwayLayerPlan, dims: Dims, pass_: str, tag: str,
                param_prefix: str, ready: Callable[[list[str]], None] | None = None
                ) -> SimTime:
    """Place one pass of a layer on the timeline from E.t; returns when the queue is free and
    the pass's output exists (E.t is moved along for the DP buckets' `ready`)."""
    sched, ops = plan.schedules[pass_], {o.name: o for o in plan.ops[pass_]}
    consumers = AFTER_ALL_REDUCE[pass_]
    producers = set(consumers.values())
    end: dict[str, SimTime] = {}
    reduced: dict[str, SimTime] = {}
    t_in, queue_free = E.t, E.t
    for group in _groups(sched):
        g0, g1 = min(p.start for p in group), max(p.end for p in group)
        ready_at = max((_input_time(ops[p.op], consumers, end, reduced, t_in) for p in group),
                       default=t_in)
        shift = max(queue_free, ready_at) - g0
        _place_group(E, sched, group, shift, f"{tag}.{pass_}.")
        for p in sorted(group, key=lambda p: p.end):
            end[p.op] = p.end + shift
            if p.op in producers:     # the TP all-reduce of this op's output, on the links
                _, span = all_reduce(E.tp, None, after=end[p.op],
                                     count=dims.rows * dims.hidden, wire_itemsize=E.e,
                                     bidirectional=E.overlap.bidirectional,
                                     label=f"{tag}.{p.op}.{pass_}.ar")
                reduced[p.op] = span.t_end
            if ready is not None and p.op in GRADS_READY:
                E.t = end[p.op]
                ready([param_prefix + n for n in GRADS_READY[p.op]])
        queue_free = g1 + shift
    return max(queue_free, *end.values(), *reduced.values())


def _input_time(op: Op, consumers: dict[str, str], end: dict[str, SimTime],
                reduced: dict[str, SimTime], t_in: SimTime) -> SimTime:
    """When op's inputs exist: its producers' ends, or their all-reduce's end."""
    times = [t_in]
    for d in op.deps:
        times.append(reduced[d] if consumers.get(op.name) == d else end[d])
    return max(times)


def _place_group(E: Engine, sched: Schedule, group: list[Placement], shift: SimTime,
                 prefix: str) -> None:
    """Segments on their CG streams, one span per op naming its CGs, the group on compute."""
    names = {p.op for p in group}
    for seg in sorted((s for s in sched.segments if s.op in names),
                      key=lambda s: (s.start, s.cg)):
        E.tl.place(f"{prefix}{seg.op}", [cg_resource(seg.cg)], seg.start + shift,
                   seg.end + shift, stage=seg.tasks)
    for p in group:
        E.tl.summary(f"{prefix}{p.op}.cgs", Span(p.start + shift, p.end + shift),
                     cat="compute", resource="+".join(cg_resource(c) for c in p.cgs),
                     stage=len(p.cgs))
    lo, hi = min(p.start for p in group), max(p.end for p in group)
    E.tl.place(f"{prefix}queue", [COMPUTE], lo + shift, hi + shift)


class SunwayEngine(Engine):
    """The executor of a Sunway rank: the same layer code, each layer pass charged as its
    SwFormer CG schedule (the math and payload run uncharged beside it)."""

    plan: SunwayLayerPlan

    def layer_pass(self, layer: Any, pass_: str, math: Callable[[Ready], Any], empty: Any,
                   ready: Ready | None = None) -> Any:
        """The math (if on) without charge, then the pass's CG schedule; gradients are
        handed to the DP buckets when the schedule finishes their GEMM."""
        out = empty
        if self.on:
            with self.payload_only():
                out = math(no_ready)     # the CG schedule hands the gradients over
        self.t = charge_pass(self, self.plan, layer.d, pass_, layer.tag, layer.p, ready)
        return out

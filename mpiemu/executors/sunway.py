"""The Sunway executor: a layer's pass charged as one SwFormer CG schedule plus the TP
all-reduces, placed group by group (SWF App. A.2 and C; SWA 3.1); every other op (embedding,
head, optimizer) charged as it comes, by the Sunway cost, as on a GPU.

The layer's ops (`devices/sunway/layer.py`) are scheduled once per pass under the policy
(intra-op, OPT2 or KA) when the executor is built; each pass replays the task groups in
order on the `cgK` streams of the timeline, each starting when the queue has drained and its
inputs exist. The TP all-reduce after `proj` and `fc2` (forward) and after `fc1.d` and
`qkv.d` (backward) runs on the links while independent groups keep the CGs busy; the op that
consumes its result waits for it. Weight gradients are handed to the DP buckets when their
GEMM ends. The pass's math (numerics on) runs uncharged beside it, its TP payload on a
duplicate communicator: payload apart from cost, as in SimGrid.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator

from ..comm.collectives import all_reduce
from ..comm.p2p import TimedComm
from ..devices.sunway.cost import AttnShape, SunwayCost
from ..devices.sunway.layer import LayerShape, layer_ops
from ..devices.sunway.schedule import Op, Option, Placement, Schedule, schedule
from ..model.dims import Dims
from ..model.executor import PassState, Ready, no_ready
from ..model.steps import Steps, drain
from ..sim.timeline import COMPUTE, SimTime, Span, Timeline
from .gpu import GpuExecutor
from .registry import ExecutorSetup

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
    def build(cls, cost: SunwayCost, dims: Dims, dtype: str, policy: str,
              attention: str) -> "SunwayLayerPlan":
        shape = LayerShape(hidden=dims.hidden, heads=dims.heads * dims.tp,
                           head_dim=dims.head_dim, ffn=dims.ffn * dims.tp, seq=dims.seq,
                           batch=dims.batch, tp=dims.tp, dtype=dtype)
        ops = {p: tuple(layer_ops(cost, shape, p, attention)) for p in ("fwd", "bwd")}
        return cls(ops, {p: cost.schedule(list(ops[p]), policy) for p in ops}, policy)


def _groups(sched: Schedule) -> list[list[Placement]]:
    by: dict[int, list[Placement]] = {}
    for p in sched.placements:
        by.setdefault(p.group, []).append(p)
    return [by[g] for g in sorted(by)]


def _input_time(op: Op, consumers: dict[str, str], end: dict[str, SimTime],
                reduced: dict[str, SimTime], t_in: SimTime) -> SimTime:
    """When op's inputs exist: its producers' ends, or their all-reduce's end."""
    times = [t_in]
    for d in op.deps:
        times.append(reduced[d] if consumers.get(op.name) == d else end[d])
    return max(times)


def _place_group(tl: Timeline, sched: Schedule, group: list[Placement], shift: SimTime,
                 prefix: str) -> None:
    """Segments on their CG streams, one span per op naming its CGs, the group on compute."""
    names = {p.op for p in group}
    for seg in sorted((s for s in sched.segments if s.op in names),
                      key=lambda s: (s.start, s.cg)):
        tl.place(f"{prefix}{seg.op}", [cg_resource(seg.cg)], seg.start + shift,
                 seg.end + shift, stage=seg.tasks)
    for p in group:
        tl.summary(f"{prefix}{p.op}.cgs", Span(p.start + shift, p.end + shift),
                   cat="compute", resource="+".join(cg_resource(c) for c in p.cgs),
                   stage=len(p.cgs))
    lo, hi = min(p.start for p in group), max(p.end for p in group)
    tl.place(f"{prefix}queue", [COMPUTE], lo + shift, hi + shift)


class SunwayExecutor(GpuExecutor):
    """The executor of a Sunway rank: the same layer code, each layer pass charged as its
    SwFormer CG schedule (the math and payload run uncharged beside it)."""

    def __init__(self, setup: ExecutorSetup) -> None:
        # Sunway ranks run GEMM and all-reduce in sequence (SWattention / SwFormer)
        super().__init__(replace(setup, tp_async=False))
        assert isinstance(setup.cost, SunwayCost)
        self.dims = setup.dims
        self.plan = SunwayLayerPlan.build(setup.cost, setup.dims, setup.dtype,
                                          setup.sunway_scheduler, setup.sunway_attention)
        self._payload_tp: TimedComm | None = None

    def layer_steps(self, tag: str, params: str, pass_: str,
                    math: Callable[[Ready], Steps[Any]], empty: Any,
                    ready: Ready | None = None) -> Steps[Any]:
        """The math (if on) without charge, then the pass's CG schedule (one step: nothing
        of another pass runs inside it); gradients are handed to the DP buckets when the
        schedule finishes their GEMM."""
        out = empty
        if self.on:
            with self._payload_only():
                out = drain(math(no_ready))     # the CG schedule hands the gradients over
        self._t = self._charge_pass(pass_, tag, params, ready)
        return out
        yield                                   # a generator: its one step ends above

    def pass_state(self) -> PassState:
        return PassState(self._t, self.tl.labels)

    def resume(self, state: PassState) -> None:
        self._t, self.tl.labels = state.t, state.labels

    @contextmanager
    def _payload_only(self) -> Iterator[None]:
        """Run the math and move the payload without charging emulated time: the TP
        collectives move the real values on a duplicate communicator with a scratch clock,
        so their messages never mix with the timed ones (SimGrid: payload apart from cost).
        """
        if self._payload_tp is None:
            tp = self.tp
            self._payload_tp = tp.sibling(tp.comm.Dup(), tp.name, Timeline())
        saved = (self.tp, self._t, self._charging)
        self.tp, self._charging = self._payload_tp, False
        try:
            yield
        finally:
            self.tp, self._t, self._charging = saved

    def _charge_pass(self, pass_: str, tag: str, params: str, ready: Ready | None
                     ) -> SimTime:
        """Place one pass of a layer on the timeline from the cursor; returns when the queue
        is free and the pass's output exists (the cursor is moved along for the DP
        buckets' `ready`)."""
        plan, dims = self.plan, self.dims
        sched, ops = plan.schedules[pass_], {o.name: o for o in plan.ops[pass_]}
        consumers = AFTER_ALL_REDUCE[pass_]
        producers = set(consumers.values())
        end: dict[str, SimTime] = {}
        reduced: dict[str, SimTime] = {}
        t_in, queue_free = self._t, self._t
        for group in _groups(sched):
            g0, g1 = min(p.start for p in group), max(p.end for p in group)
            ready_at = max((_input_time(ops[p.op], consumers, end, reduced, t_in)
                            for p in group), default=t_in)
            shift = max(queue_free, ready_at) - g0
            _place_group(self.tl, sched, group, shift, f"{tag}.{pass_}.")
            for p in sorted(group, key=lambda p: p.end):
                end[p.op] = p.end + shift
                if p.op in producers:     # the TP all-reduce of this op's output, on the links
                    _, span = all_reduce(self.tp, None, reduce_s=self.cost.reduction_s,
                                         after=end[p.op], count=dims.rows * dims.hidden,
                                         wire_itemsize=self.e,
                                         bidirectional=self.overlap.bidirectional,
                                         label=f"{tag}.{p.op}.{pass_}.ar")
                    reduced[p.op] = span.t_end
                if ready is not None and p.op in GRADS_READY:
                    self._t = end[p.op]
                    ready([params + n for n in GRADS_READY[p.op]])
            queue_free = g1 + shift
        return max(queue_free, *end.values(), *reduced.values())


# -- a CG schedule on a timeline (SWattention alone: `studies/sunway.py`) -------------------
def cg_resource(cg: int) -> str:
    """Timeline resource of one core group."""
    return f"cg{cg}"


def charge_schedule(tl: Timeline, sched: Schedule, after: SimTime, *, prefix: str = "",
                    flops: dict[str, float] | None = None) -> SimTime:
    """Place a CG schedule on the timeline: one event per op segment on its `cgK` stream, one
    span per op listing its CGs, and the whole task queue on `compute`; returns its end."""
    cgs = sorted({seg.cg for seg in sched.segments})
    t0 = tl.earliest([COMPUTE] + [cg_resource(c) for c in cgs], after)
    for seg in sorted(sched.segments, key=lambda g: (g.start, g.cg)):
        tl.place(f"{prefix}{seg.op}", [cg_resource(seg.cg)], t0 + seg.start, t0 + seg.end,
                 stage=seg.tasks)
    for p in sched.placements:
        tl.summary(f"{prefix}{p.op}.cgs", Span(t0 + p.start, t0 + p.end), cat="compute",
                   resource="+".join(cg_resource(c) for c in p.cgs),
                   flops=(flops or {}).get(p.op, 0.0), stage=len(p.cgs))
    return tl.place(f"{prefix}cg_queue", [COMPUTE], t0, t0 + sched.makespan).t_end


def charge_attention(tl: Timeline, cost: SunwayCost, name: str, shape: AttnShape,
                     pass_: str, after: SimTime, *, kernel: str = "swattention") -> SimTime:
    """SWattention: heads on CGs (SWA 3.1), one event per CG; standard: its operators in a
    row over all CGs. Raises SunwayOutOfMemory where the operator does not fit."""
    att = cost.attention(pass_, shape, kernel=kernel)
    if kernel == "standard":
        t = after
        for k in att.kernels:
            t = tl.reserve(f"{name}.{k.name}", [COMPUTE], k.time_s, t, flops=k.flops,
                           dram_bytes=k.read_bytes + k.write_bytes).t_end
        return t
    op = Op(name, "attention", (Option(kernel, att.tasks),))
    return charge_schedule(tl, schedule([op], cost.sw.core_groups), after,
                           flops={name: att.flops})

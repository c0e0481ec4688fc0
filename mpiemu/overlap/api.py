"""The two GEMM + TP-collective pairs the transformer layers call, behind one strategy switch.

`gemm_then_reduce` is the row-parallel GEMM followed by its reduce-scatter or all-reduce;
`gather_then_gemm` is the all-gather of row shards followed by the column-parallel GEMM.
Every strategy of thesis 8.4.3 (plus software overlap, 8.2.2) runs the same ring schedule
on real data (or on shapes alone when x = w = None) and charges emulated time by its traits
(`strategy.TRAITS`): sequential and ideal multiply whole matrices, the fused strategies one
chunk at a time. For mode "all_reduce" the reduce-scatter is followed by a sequential
all-gather, fused or not (thesis 8.4.3); sequential, where NCCL's tuner would not run the
all-reduce as a ring (NVLS, tree, hierarchical), the GEMM is followed by the plain collective.
Trace events: `<name>.gemm` (compute; `stage` = the GEMM's stage count), `rs.send`,
`rs.reduce`, `ag.send` (comm, the ring steps), and one collective span per call:
`<name>.rs` (reduce-scatter), `<name>.ar` (all-reduce = RS then AG) or `<name>.ag`.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

from ..comm.collectives import all_reduce
from ..comm.cost import choose
from ..comm.p2p import Call, TimedComm
from ..devices.cost import DeviceCost
from ..devices.contention import T3Params
from ..devices.specs import DeviceSpec, dtype_bytes
from ..sim import charge as ops
from ..sim.timeline import SimTime, Span, latest
from . import rs
from .ag import AgGemm, ring_all_gather
from .costs import OverlapStats
from .strategy import MODES, STRATEGIES, Overlap


class GemmShape(NamedTuple):
    """C[M, N] = A[M, K] @ B[K, N]; M is the token (row) dimension that is scattered."""

    m: int
    n: int
    k: int


MatMul = Callable[[np.ndarray, np.ndarray], np.ndarray]


def exact(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return x @ w


def _matmul(x: np.ndarray | None, w: np.ndarray | None, matmul: MatMul = exact
            ) -> np.ndarray | None:
    """The pair's GEMM (`matmul`: in the numerics' precision; the fused strategies'
    chunked GEMMs are exact, `run.numeric_dtype` bf16 / fp16 refuses them)."""
    return None if x is None or w is None else matmul(x, w)


def overlap_params(spec: DeviceSpec, ov: Overlap) -> T3Params | None:
    """The preset's overlap-model parameters ([t3]), required by every strategy past `ideal`."""
    if ov.strategy in ("sequential", "ideal"):
        return spec.t3
    if spec.kind != "gpu":
        raise ValueError(f"overlap.strategy={ov.strategy!r} models a GPU memory system; device "
                         f"{spec.name} is a {spec.kind}: use 'sequential' or 'ideal'")
    if spec.t3 is None:
        raise ValueError(f"device {spec.name} has no [t3] section with the overlap-model "
                         "parameters (see mpiemu/devices/presets/t3-gpu.toml)")
    return spec.t3


def _protocol(tc: TimedComm, op: str, nbytes: float, itemsize: int, fused: bool
              ) -> tuple[Call, SimTime]:
    """The ring's call: its protocol and channel share as NCCL's tuner would pick them for
    this size (`comm.cost.choose`, the ring only: the fused schedules are rings), and the
    call's base latency, paid by the strategies that issue a separate collective (not
    fused)."""
    ch = choose(tc, op, nbytes, itemsize, "ring", tc.tuning.protocol)
    call = Call(ch.protocol, tc.net.spec.channel_share(ch.protocol, nbytes, tc.size), "ring")
    return call, 0.0 if fused else tc.net.spec.base("ring", ch.protocol)


def _dram(stats: OverlapStats, op: str, before: dict[str, float]) -> float:
    """DRAM bytes of one op (`rs`/`ag`) during this call (stats may be reused across calls)."""
    return sum(stats.dram[f"{op}_{d}"] - before[f"{op}_{d}"] for d in ("read", "write"))


def _gemm_stats(stats: OverlapStats, cost: DeviceCost, shape: GemmShape, dtype: str,
                duration: float) -> None:
    """A plain GEMM's time, stages and DRAM traffic into the call's stats."""
    g = cost.gemm(shape.m, shape.n, shape.k, dtype=dtype)
    stats.gemm_s = stats.gemm_isolated_s = duration
    stats.n_stages = g.n_stages
    stats.add("gemm_read", g.dram_read_bytes)
    stats.add("gemm_write", g.dram_write_bytes)


def _single(tc: TimedComm, cost: DeviceCost, x: np.ndarray | None, w: np.ndarray | None,
            shape: GemmShape, dtype: str, after: SimTime, name: str, stats: OverlapStats,
            matmul: MatMul = exact) -> tuple[np.ndarray | None, Span]:
    """One rank: the GEMM alone (no collective to overlap)."""
    g = ops.gemm(tc.tl, cost, f"{name}.gemm", shape.m, shape.n, shape.k, dtype=dtype,
                 after=after)
    _gemm_stats(stats, cost, shape, dtype, g.duration)
    stats.total_s = g.duration
    return _matmul(x, w, matmul), g


def _gemm_then_all_reduce(tc: TimedComm, cost: DeviceCost, x: np.ndarray | None,
                          w: np.ndarray | None, shape: GemmShape, dtype: str, after: SimTime,
                          overlap: Overlap, name: str, stats: OverlapStats,
                          matmul: MatMul = exact, gemm_dtype: str | None = None
                          ) -> tuple[np.ndarray | None, Span]:
    """Sequential, where NCCL's tuner runs this all-reduce other than as a ring (NVLS on an
    NVSwitch node, a tree or the hierarchical form across nodes): the GEMM, then the
    collective as `comm.collectives.all_reduce` runs it, as for the backward's all-reduce of
    the same size (Megatron-LM calls the same NCCL all-reduce in both passes)."""
    t0 = latest(after)
    y, g = _single(tc, cost, x, w, shape, gemm_dtype or dtype, t0, name, stats, matmul)
    out, span = all_reduce(tc, y, reduce_s=cost.reduction_s, after=g.t_end,
                           count=shape.m * shape.n,
                           wire_itemsize=dtype_bytes(dtype), bidirectional=overlap.bidirectional,
                           label=f"{name}.ar", unit=shape.n)
    stats.total_s = span.t_end - t0             # from the call's start, as the ring path's
    return out, Span(t0, span.t_end)


def overlapped_gemm_then_reduce(tc: TimedComm, x: np.ndarray | None, w: np.ndarray | None, *,
                                cost: DeviceCost, shape: GemmShape, mode: str, dtype: str,
                                after: SimTime,
                                overlap: Overlap, name: str, stats: OverlapStats | None = None,
                                matmul: MatMul = exact, gemm_dtype: str | None = None
                                ) -> tuple[np.ndarray | None, Span]:
    """GEMM -> ring reduce-scatter (-> all-gather) under any strategy (thesis 8.3, 8.4.3)."""
    stats = OverlapStats() if stats is None else stats
    stats.strategy = overlap.label
    gd = gemm_dtype or dtype
    if tc.size == 1:
        return _single(tc, cost, x, w, shape, gd, after, name, stats, matmul)
    itemsize, t = dtype_bytes(dtype), overlap.traits
    if mode == "all_reduce" and not (t.fused or t.concurrent) and choose(
            tc, mode, shape.m * shape.n * itemsize, itemsize, tc.tuning.algorithm,
            tc.tuning.protocol, overlap.bidirectional).algorithm != "ring":
        return _gemm_then_all_reduce(tc, cost, x, w, shape, dtype, after, overlap, name, stats,
                                     matmul, gd)
    before = dict(stats.dram)
    call, base = _protocol(tc, mode, shape.m * shape.n * itemsize, itemsize, t.fused)
    s = rs.setup(tc, cost, call, overlap, shape.m, shape.n, shape.k, gd, itemsize,
                 latest(after), overlap_params(cost.spec, overlap), stats, name)
    y, gemm_end = None, -np.inf
    if not t.fused:
        y = _matmul(x, w, matmul)
        gemm_end = rs.place_gemm(s, stats, name, s.t0)
        s.ready_all = (s.t0 if t.concurrent else gemm_end) + base
    run, out = rs.run(s, x, w, y)
    if t.fused:
        gemm_end = s.clock.gemm_end()
    total = shape.m * shape.n * itemsize
    stats.rs_s = run.done - run.first_send
    end = max(run.done, gemm_end)
    if mode == "all_reduce":         # one all-reduce span (RS then AG), as comm.ring records it
        out, _, end = ring_all_gather(tc, cost, call, out, m=shape.m, n=shape.n,
                                      itemsize=itemsize, start=end, ov=overlap, name=name,
                                      stats=stats)
        tc.tl.summary(f"{name}.ar", Span(run.first_send, end), resource=f"coll.{tc.name}",
                      nbytes=total,
                      dram_bytes=_dram(stats, "rs", before) + _dram(stats, "ag", before))
    else:
        tc.tl.summary(f"{name}.rs", Span(run.first_send, run.done),
                      resource=f"coll.{tc.name}", nbytes=total,
                      dram_bytes=_dram(stats, "rs", before))
    stats.total_s = end - s.t0
    return out, Span(s.t0, end)


def overlapped_gather_then_gemm(tc: TimedComm, x_shard: np.ndarray | None,
                                w: np.ndarray | None, *, cost: DeviceCost, shape: GemmShape,
                                dtype: str,
                                after: SimTime, overlap: Overlap, name: str,
                                stats: OverlapStats | None = None,
                                gathered_out: np.ndarray | None = None,
                                matmul: MatMul = exact, gemm_dtype: str | None = None
                                ) -> tuple[np.ndarray | None, Span]:
    """Ring all-gather of row shards -> column-parallel GEMM under any strategy (8.6.2)."""
    stats = OverlapStats() if stats is None else stats
    stats.strategy = overlap.label
    gd = gemm_dtype or dtype
    if tc.size == 1:
        if gathered_out is not None and x_shard is not None:
            gathered_out[...] = x_shard
        return _single(tc, cost, x_shard, w, shape, gd, after, name, stats, matmul)
    itemsize, t = dtype_bytes(dtype), overlap.traits
    before = dict(stats.dram)
    params = overlap_params(cost.spec, overlap)
    total = shape.m * shape.k * itemsize
    call, base = _protocol(tc, "all_gather", total, itemsize, t.fused)
    if t.fused:
        fused = AgGemm(tc, cost, call, overlap, shape.m, shape.n, shape.k, dtype, itemsize,
                       latest(after), params, stats, name)
        y, a0, a1, end = fused.run(x_shard, w, gathered_out)
        tc.tl.summary(f"{name}.ag", Span(a0, a1), resource=f"coll.{tc.name}",
                      nbytes=total, dram_bytes=_dram(stats, "ag", before))
        stats.total_s = end - fused.t0
        return y, Span(min(a0, fused.t0), end)
    t_ag = latest(after)
    full, a0, ag_end = ring_all_gather(tc, cost, call, x_shard, m=shape.m, n=shape.k,
                                       itemsize=itemsize, start=t_ag + base, ov=overlap,
                                       name=name, stats=stats, out=gathered_out)
    tc.tl.summary(f"{name}.ag", Span(a0, ag_end), resource=f"coll.{tc.name}", nbytes=total,
                  dram_bytes=_dram(stats, "ag", before))
    g = ops.gemm(tc.tl, cost, f"{name}.gemm", shape.m, shape.n, shape.k, dtype=gd,
                 after=t_ag if t.concurrent else ag_end)
    _gemm_stats(stats, cost, shape, gd, g.duration)
    stats.total_s = max(g.t_end, ag_end) - min(t_ag, g.t_start)
    return _matmul(full, w, matmul), Span(min(a0, g.t_start), max(g.t_end, ag_end))


ReduceImpl = Callable[..., tuple[np.ndarray | None, Span]]
STRATEGY_IMPLS: dict[str, tuple[ReduceImpl, ReduceImpl]] = {
    s: (overlapped_gemm_then_reduce, overlapped_gather_then_gemm) for s in STRATEGIES
}


def _impls(overlap: Overlap) -> tuple[ReduceImpl, ReduceImpl]:
    if overlap.strategy not in STRATEGY_IMPLS:
        raise ValueError(f"overlap.strategy={overlap.strategy!r} is not implemented; "
                         f"available: {sorted(STRATEGY_IMPLS)}")
    return STRATEGY_IMPLS[overlap.strategy]


def gemm_then_reduce(tc: TimedComm, x: np.ndarray | None, w: np.ndarray | None, *,
                     cost: DeviceCost, shape: GemmShape, mode: str, dtype: str, after: SimTime,
                     overlap: Overlap = Overlap(), name: str = "gemm",
                     stats: OverlapStats | None = None, matmul: MatMul = exact,
                     gemm_dtype: str | None = None) -> tuple[np.ndarray | None, Span]:
    """y = sum over the TP group of x @ w, all-reduced or reduce-scattered by rows.

    forward: GEMM -> reduce-scatter (or all-reduce); conjugate: `gather_then_gemm`.
    x: [M, K_local], w: [K_local, N] -> [M, N] (all_reduce) or [rows of rank, N].
    With x = w = None only the schedule runs (timing-only mode). `stats` (optional, a fresh
    `OverlapStats` per call) receives the time split and DRAM traffic of this call.
    `gemm_dtype`: the GEMM's own dtype where it differs from the tensors' (FP8 GEMMs of
    bf16 tensors).
    """
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}; choose one of {list(MODES)}")
    impl = _impls(overlap)[0]
    return impl(tc, x, w, cost=cost, shape=shape, mode=mode, dtype=dtype, after=after,
                overlap=overlap, name=name, stats=stats, matmul=matmul,
                gemm_dtype=gemm_dtype or dtype)


def gather_then_gemm(tc: TimedComm, x_shard: np.ndarray | None, w: np.ndarray | None, *,
                     cost: DeviceCost, shape: GemmShape, dtype: str, after: SimTime,
                     overlap: Overlap = Overlap(), name: str = "gemm",
                     stats: OverlapStats | None = None,
                     gathered_out: np.ndarray | None = None, matmul: MatMul = exact,
                     gemm_dtype: str | None = None) -> tuple[np.ndarray | None, Span]:
    """y = all_gather(x_shard rows) @ w.

    forward: all-gather -> GEMM; conjugate: `gemm_then_reduce` with reduce-scatter.
    x_shard: [rows of rank, K], w: [K, N_local] -> [M, N_local]. `gathered_out` ([M, K]),
    if given, receives the gathered rows: the weight gradient needs them, and fused kernels
    keep that buffer anyway (TransformerEngine userbuffers).
    """
    impl = _impls(overlap)[1]
    return impl(tc, x_shard, w, cost=cost, shape=shape, dtype=dtype, after=after,
                overlap=overlap, name=name, stats=stats, gathered_out=gathered_out,
                matmul=matmul, gemm_dtype=gemm_dtype or dtype)


__all__ = ["GemmShape", "OverlapStats", "gather_then_gemm", "gemm_then_reduce",
           "overlap_params"]

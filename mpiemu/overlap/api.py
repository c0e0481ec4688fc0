"""The two GEMM + TP-collective pairs the transformer layers call, behind one strategy switch.

`gemm_then_reduce` is the row-parallel GEMM followed by its reduce-scatter or all-reduce;
`gather_then_gemm` is the all-gather of row shards followed by the column-parallel GEMM.
The `sequential` strategy here is the reference: GEMM, then ring collective, serialized by the
data dependency (thesis 8.4.3 "Sequential"). Fused strategies (T3 and friends, thesis 8.3)
plug in through `STRATEGY_IMPLS` with the same signature and must return the same numbers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..comm.p2p import TimedComm
from ..comm.ring import all_gather, all_reduce, reduce_scatter
from ..hw.specs import dtype_bytes
from ..sim import ops
from ..sim.timeline import SimTime, Span
from .strategy import MODES, STRATEGIES, Overlap

@dataclass(frozen=True)
class GemmShape:
    """C[M, N] = A[M, K] @ B[K, N]; M is the token (row) dimension that is scattered."""

    m: int
    n: int
    k: int


def _matmul(x: np.ndarray | None, w: np.ndarray | None) -> np.ndarray | None:
    return None if x is None or w is None else x @ w


def sequential_gemm_then_reduce(tc: TimedComm, x: np.ndarray | None, w: np.ndarray | None, *,
                                shape: GemmShape, mode: str, dtype: str, after: SimTime,
                                overlap: Overlap, name: str) -> tuple[np.ndarray | None, Span]:
    """GEMM on the compute stream, then the ring collective once the whole output exists."""
    y = _matmul(x, w)
    g = ops.gemm(tc.tl, tc.model, f"{name}.gemm", shape.m, shape.n, shape.k, dtype=dtype,
                 after=after)
    coll = all_reduce if mode == "all_reduce" else reduce_scatter
    out, span = coll(tc, y, after=g.t_end, count=shape.m * shape.n,
                     wire_itemsize=dtype_bytes(dtype), bidirectional=overlap.bidirectional,
                     label=f"{name}.{'ar' if mode == 'all_reduce' else 'rs'}",
                     unit=shape.n)
    return out, Span(g.t_start, span.t_end)


def sequential_gather_then_gemm(tc: TimedComm, x_shard: np.ndarray | None,
                                w: np.ndarray | None, *, shape: GemmShape, dtype: str,
                                after: SimTime, overlap: Overlap, name: str
                                ) -> tuple[np.ndarray | None, Span]:
    """Ring all-gather of the row shards, then the GEMM on the gathered rows."""
    full, ag = all_gather(tc, x_shard, total=shape.m * shape.k, after=after,
                          wire_itemsize=dtype_bytes(dtype), bidirectional=overlap.bidirectional,
                          label=f"{name}.ag", unit=shape.k)
    y = _matmul(full, w)
    g = ops.gemm(tc.tl, tc.model, f"{name}.gemm", shape.m, shape.n, shape.k, dtype=dtype,
                 after=ag.t_end)
    return y, Span(ag.t_start, g.t_end)


ReduceImpl = Callable[..., tuple[np.ndarray | None, Span]]
STRATEGY_IMPLS: dict[str, tuple[ReduceImpl, ReduceImpl]] = {
    "sequential": (sequential_gemm_then_reduce, sequential_gather_then_gemm),
}


def _impls(overlap: Overlap) -> tuple[ReduceImpl, ReduceImpl]:
    if overlap.strategy not in STRATEGY_IMPLS:
        raise ValueError(f"overlap.strategy={overlap.strategy!r} is not implemented; "
                         f"available: {sorted(STRATEGY_IMPLS)}")
    return STRATEGY_IMPLS[overlap.strategy]


def gemm_then_reduce(tc: TimedComm, x: np.ndarray | None, w: np.ndarray | None, *,
                     shape: GemmShape, mode: str, dtype: str, after: SimTime,
                     overlap: Overlap = Overlap(), name: str = "gemm"
                     ) -> tuple[np.ndarray | None, Span]:
    """y = sum over the TP group of x @ w, all-reduced or reduce-scattered by rows.

    forward: GEMM -> reduce-scatter (or all-reduce); conjugate: `gather_then_gemm`.
    x: [M, K_local], w: [K_local, N] -> [M, N] (all_reduce) or [rows of rank, N].
    With x = w = None only the schedule runs (timing-only mode).
    """
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}; choose one of {list(MODES)}")
    impl = _impls(overlap)[0]
    return impl(tc, x, w, shape=shape, mode=mode, dtype=dtype, after=after, overlap=overlap,
                name=name)


def gather_then_gemm(tc: TimedComm, x_shard: np.ndarray | None, w: np.ndarray | None, *,
                     shape: GemmShape, dtype: str, after: SimTime,
                     overlap: Overlap = Overlap(), name: str = "gemm"
                     ) -> tuple[np.ndarray | None, Span]:
    """y = all_gather(x_shard rows) @ w.

    forward: all-gather -> GEMM; conjugate: `gemm_then_reduce` with reduce-scatter.
    x_shard: [rows of rank, K], w: [K, N_local] -> [M, N_local].
    """
    impl = _impls(overlap)[1]
    return impl(tc, x_shard, w, shape=shape, dtype=dtype, after=after, overlap=overlap,
                name=name)

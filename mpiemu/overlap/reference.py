"""One-process references with the exact summation order of the ring schedules (pure numpy).

Floating-point addition is commutative but not associative, so a bitwise reference must fold
each chunk over the ranks in the ring's order (overlap_software.md 6.3) and, for fused
schedules, multiply the same row blocks the fused GEMM multiplies (a BLAS may block a
[rows, K] slice differently from the whole matrix).
"""
from __future__ import annotations

import numpy as np

from ..comm.lanes import Lane, lanes


def ring_lanes(m: int, size: int, bidirectional: bool) -> list[Lane]:
    """The lanes of a ring on one node: rank order, and reversed if bidirectional."""
    fwd = tuple(range(size))
    return lanes(m, [fwd, fwd[::-1]] if bidirectional else [fwd])


def gemm_rs_reference(xs: list[np.ndarray], ws: list[np.ndarray], *, bidirectional: bool,
                      fused: bool) -> list[np.ndarray]:
    """Rows each rank holds after GEMM -> ring reduce-scatter: sum_q xs[q] @ ws[q], chunked.

    fused=False: every rank multiplies whole matrices first (sequential, ideal);
    fused=True: each lane's chunk is its own GEMM (sw-overlap, t3, t3-mca).
    """
    size = len(xs)
    if size == 1:
        return [xs[0] @ ws[0]]
    m = xs[0].shape[0]
    full = None if fused else [x @ w for x, w in zip(xs, ws)]

    def partial(q: int, lo: int, hi: int) -> np.ndarray:
        if full is not None:
            return full[q][lo:hi]
        return np.matmul(xs[q][lo:hi], ws[q])

    outs = []
    for c in range(size):
        parts = []
        for lane in ring_lanes(m, size, bidirectional):
            lo, hi = lane.bounds[c]
            order = lane.fold_ranks(c)
            acc = partial(order[0], lo, hi).copy()
            for q in order[1:]:
                acc = partial(q, lo, hi) + acc
            parts.append(acc)
        outs.append(np.concatenate(parts, axis=0))
    return outs


def ag_gemm_reference(shards: list[np.ndarray], w: np.ndarray, *, bidirectional: bool,
                      fused: bool) -> np.ndarray:
    """all_gather(shards) @ w; fused: one GEMM per lane chunk (exact, no reduction)."""
    full = np.concatenate(shards, axis=0)
    if not fused or len(shards) == 1:
        return full @ w
    out = np.empty((full.shape[0], w.shape[1]), np.result_type(full, w))
    for lane in ring_lanes(full.shape[0], len(shards), bidirectional):
        for lo, hi in lane.bounds:
            out[lo:hi] = np.matmul(full[lo:hi], w)
    return out

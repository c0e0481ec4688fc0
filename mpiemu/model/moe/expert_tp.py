"""Expert tensor parallelism's exchanges in an MoE layer (Megatron-Core `token_dispatcher.py`
`MoEAlltoAllTokenDispatcher` with an expert-TP group): after the EP all-to-all each rank
all-gathers its expert-TP peers' received rows, so every peer runs the same tokens through
its slice of each expert's FFN (FC-1 column-parallel, FC-2 row-parallel); a reduce-scatter
sums the partial outputs and hands each peer its own rows back. Backward runs the
conjugates: the output gradient gathered, the input gradient reduce-scattered.

The peers' row counts differ with routing; Megatron-Core passes them as split sizes
(`gather_from_sequence_parallel_region(..., output_split_sizes)`), which PyTorch runs as
grouped broadcasts / reduces. Here each peer's rows are padded to the largest peer's and
the gather and reduce-scatter are the ring collectives of that size (ASSUMPTION: equal to
the split-size exchange under balance, the padded size otherwise). Rows per local expert,
gathered: expert-major, peers in expert-TP order (Megatron's `sort_chunks_by_idxs`).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .dispatch import ExpertLayer, Plan


def gather_rows(lay: ExpertLayer, name: str, xs: list[Any] | None, plan: Plan
                ) -> list[Any] | None:
    """Per local expert: every expert-TP peer's rows of it (this rank's `xs` among them)."""
    if lay.etp is None:
        return xs
    E, h, per = lay.E, lay.d.hidden, plan.peer_expert_rows()
    width = int(per.sum(1).max())
    if width == 0:                      # no peer received a row: nothing moves
        return xs
    flat = None
    if E.on:
        assert xs is not None
        flat = _padded(np.concatenate(xs), width).reshape(-1)
    got = E.all_gather(lay.etp, f"{lay.tag}.{name}", flat, width * h, E.e)
    if got is None:
        return None
    blocks = np.asarray(got).reshape(len(per), width, h)
    cut = [np.split(blocks[j, :per[j].sum()], np.cumsum(per[j])[:-1]) for j in range(len(per))]
    return [np.concatenate([c[i] for c in cut]) for i in range(plan.per_rank)]


def scatter_rows(lay: ExpertLayer, name: str, ys: list[Any] | None, plan: Plan
                 ) -> list[Any] | None:
    """Conjugate of `gather_rows`: partial rows summed over the expert-TP peers, this
    rank's own rows per local expert kept."""
    if lay.etp is None:
        return ys
    E, h, per = lay.E, lay.d.hidden, plan.peer_expert_rows()
    width, size = int(per.sum(1).max()), len(per)
    if width == 0:
        return ys
    flat = None
    if E.on:
        assert ys is not None
        cut = [np.split(y, np.cumsum(per[:, i])[:-1]) for i, y in enumerate(ys)]
        flat = np.concatenate([_padded(np.concatenate([c[j] for c in cut]), width)
                               for j in range(size)]).reshape(-1)
    got = E.reduce_scatter(lay.etp, f"{lay.tag}.{name}", flat, size * width * h, E.e)
    if got is None:
        return None
    mine = per[plan.etp_rank]
    own = np.asarray(got).reshape(width, h)[:mine.sum()]
    return np.split(own, np.cumsum(mine)[:-1])


def _padded(x: np.ndarray, rows: int) -> np.ndarray:
    """x [r, H] with zero rows appended up to `rows`."""
    return np.concatenate([x, np.zeros((rows - len(x), x.shape[1]), x.dtype)])

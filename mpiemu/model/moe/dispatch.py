"""Token dispatch and combine over the expert-parallel group: Megatron-Core's all-to-all
dispatcher (`moe/token_dispatcher.py` `MoEAlltoAllTokenDispatcher`).

A rank's kept choices are permuted into expert order (`permute`: for each expert, its
tokens in token order), the per-expert counts are all-gathered over the EP group (every
rank then knows what it sends and receives: Megatron's `preprocess`), the rows travel in
one all-to-all-v (to the rank holding each expert, experts split contiguously over EP),
and the received rows are regrouped by local expert (`sort_chunks_by_idxs`). Combine runs
the same in reverse; backward's exchanges are their conjugates (dispatch <-> combine).
"""
from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import numpy as np

from ..block import Cache, Params
from ..dims import Dims
from ..executor import Array, Executor, Ready
from .config import MoeConfig


class ExpertLayer(Protocol):
    """What a dispatcher (`alltoall`, `allgather`) uses of its MoE layer (`layer.MoeMlp`)."""

    E: Executor
    ep: Any                     # the EP group (`comm.p2p.TimedComm`), None without EP
    etp: Any                    # the expert-TP group, None without expert TP
    gather_group: Any           # expert TP x EP (the all-gather dispatcher's), or None
    d: Dims
    moe: MoeConfig
    tag: str
    mine: range                 # the global indices of this rank's experts

    def experts_forward(self, xs: list[Array] | None, ms: list[int], P: Params, c: Cache
                        ) -> list[Array] | None: ...

    def experts_backward(self, dos: list[Array] | None, c: Cache, P: Params, G: Params,
                         ready: Ready) -> list[Array] | None: ...

    def _move_cost(self, rows: int, weights: bool = False) -> Any: ...


class Plan(NamedTuple):
    """Who sends what to whom for one MoE layer's pass on one rank (EP group of size ep;
    with expert TP, the counts of every expert-TP peer's EP group too)."""

    order: np.ndarray           # kept choices (flat [n k] indices), expert-major, token order
    counts: np.ndarray          # [ep, E]: every EP rank's tokens per expert
    rank: int                   # this rank in the EP group
    per_rank: int               # experts per EP rank
    peers: np.ndarray | None = None    # [etp, ep, E]: each expert-TP peer's `counts`
    etp_rank: int = 0           # this rank in the expert-TP group

    @property
    def ep(self) -> int:
        return len(self.counts)

    def send_rows(self) -> list[int]:
        """Rows this rank sends to each EP rank (the tokens of its experts)."""
        mine = self.counts[self.rank].reshape(self.ep, self.per_rank)
        return [int(x) for x in mine.sum(1)]

    def recv_rows(self) -> list[int]:
        """Rows this rank receives from each EP rank (their tokens of its experts)."""
        return [int(x) for x in self.local_counts().sum(1)]

    def local_counts(self) -> np.ndarray:
        """[ep, per_rank]: rows from each source for each of this rank's experts."""
        lo = self.rank * self.per_rank
        return self.counts[:, lo:lo + self.per_rank]

    def expert_rows(self) -> list[int]:
        """Rows each of this rank's experts computes (the grouped GEMM's M per group): its
        own received rows, and under expert TP every peer's (gathered)."""
        if self.peers is None:
            return [int(x) for x in self.local_counts().sum(0)]
        return [int(x) for x in self.peer_expert_rows().sum(0)]

    def peer_expert_rows(self) -> np.ndarray:
        """[etp, per_rank]: rows each expert-TP peer received for each local expert."""
        assert self.peers is not None
        lo = self.rank * self.per_rank
        return self.peers[:, :, lo:lo + self.per_rank].sum(1)


def permute(x: np.ndarray, order: np.ndarray, top_k: int) -> np.ndarray:
    """[sum counts, H]: the token of each kept choice, expert-major (Megatron `permute`)."""
    return x[order // top_k]


def unpermute(y: np.ndarray, order: np.ndarray, weights: np.ndarray, n: int) -> np.ndarray:
    """[n, H]: each token's expert outputs times their weights, summed (`unpermute`)."""
    out = np.zeros((n, y.shape[1]), y.dtype)
    np.add.at(out, order // weights.shape[1], y * weights.reshape(-1)[order][:, None])
    return out


def by_expert(chunks: list[np.ndarray], plan: Plan) -> list[np.ndarray]:
    """Received rows (one chunk per source, each expert-major) regrouped per local expert,
    sources in rank order."""
    lc = plan.local_counts()
    cut = [np.split(c, np.cumsum(lc[s])[:-1]) for s, c in enumerate(chunks)]
    return [np.concatenate([cut[s][j] for s in range(plan.ep)]) for j in range(plan.per_rank)]


def by_source(groups: list[np.ndarray], plan: Plan) -> list[np.ndarray]:
    """Conjugate of `by_expert`: per-expert rows back into one chunk per source."""
    lc = plan.local_counts()
    cut = [np.split(g, np.cumsum(lc[:, j])[:-1]) for j, g in enumerate(groups)]
    return [np.concatenate([cut[j][s] for j in range(plan.per_rank)]) for s in range(plan.ep)]


def split_rows(x: np.ndarray, rows: list[int]) -> list[np.ndarray]:
    """x's rows in consecutive chunks of these sizes."""
    return np.split(x, np.cumsum(rows)[:-1])

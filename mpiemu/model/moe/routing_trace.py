"""Routing recorded and replayed: `routing.npz` in a run's directory.

Every MoE run writes what it routed: `counts[iteration, layer, rank, expert]`, the tokens
each rank sent to each expert over the step's micro-batches (kept choices), and, with
numerics on, `choices[iteration, layer, token, k]`: each token's experts (-1 where
capacity dropped the choice), tokens numbered sample x seq_len + position over the global
batch. A timing-only run with `moe.tokens = "trace"` replays `choices` (`moe.trace`: the
file): each rank counts its own tokens' choices, layer l reading the recorded layer
l mod L, iteration i the recorded i mod I, token t the recorded t mod T, so a larger model
or batch replays a smaller run's routing. Same experts and top_k required.
"""
from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from .config import MoeConfig

FILE = "routing.npz"


class RoutingLog:
    """One rank's record of a run's routing (`MoeRun.routed` feeds it)."""

    def __init__(self) -> None:
        self.counts: dict[tuple[int, int], np.ndarray] = {}
        self.choices: dict[tuple[int, int], list[tuple[np.ndarray, np.ndarray]]] = {}

    def add(self, it: int, layer: int, counts: np.ndarray, tokens: np.ndarray | None,
            chosen: np.ndarray | None) -> None:
        key = (it, layer)
        have = self.counts.get(key)
        self.counts[key] = counts.copy() if have is None else have + counts
        if tokens is not None and chosen is not None:
            self.choices.setdefault(key, []).append((tokens, chosen))


def write(world: Any, log: RoutingLog, path: Path, layers: int, tokens: int, rank: int,
          moe: MoeConfig) -> None:
    """Gather every rank's log to rank 0 (`rank`: this rank's place) and save the file."""
    every = world.gather((rank, log.counts, log.choices), root=0)
    if world.Get_rank() != 0:
        return
    its = 1 + max((it for _, c, _ in every for it, _ in c), default=-1)
    ranks = 1 + max(r for r, _, _ in every)
    counts = np.zeros((its, layers, ranks, moe.experts), np.int64)
    for r, cnt, _ in every:
        for (it, layer), c in cnt.items():
            counts[it, layer, r] += c
    arrays: dict[str, Any] = {"counts": counts, "experts": moe.experts, "top_k": moe.top_k}
    if any(cho for _, _, cho in every):      # the router ran: every token's choices
        choices = np.full((its, layers, tokens, moe.top_k), -1, np.int32)
        for _, _, cho in every:
            for (it, layer), parts in cho.items():
                for tok, ch in parts:
                    choices[it, layer, tok] = ch
        arrays["choices"] = choices
    np.savez_compressed(path, **arrays)


def load(path: str, moe: MoeConfig) -> np.ndarray:
    """The recorded choices of a routing trace, checked against this model's experts;
    ValueError in one line naming what is wrong."""
    try:
        with np.load(path) as f:
            experts, top_k = int(f["experts"]), int(f["top_k"])
            choices = f["choices"] if "choices" in f.files else None
    except (OSError, KeyError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise ValueError(f"is not a readable routing trace ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else 'damaged'})") from None
    if choices is None:
        raise ValueError("holds counts only (recorded timing only); record with "
                         "run.numerics='on'")
    if (experts, top_k) != (moe.experts, moe.top_k):
        raise ValueError(f"was recorded with {experts} experts, top_k {top_k}; this model has "
                         f"moe.experts={moe.experts}, moe.top_k={moe.top_k}")
    if choices.ndim != 4 or choices.shape[-1] != top_k or choices.min() < -1 or \
            choices.max() >= experts:
        raise ValueError("is damaged (choices out of range)")
    return choices


def replayed(choices: np.ndarray, it: int, layer: int, tokens: np.ndarray,
             experts: int) -> np.ndarray:
    """[E]: what these tokens chose in the recorded run (wrapped as the module says)."""
    I, L, T, _ = choices.shape
    picked = choices[it % I, layer % L, tokens % T].reshape(-1)
    return np.bincount(picked[picked >= 0], minlength=experts).astype(np.int64)

"""The router's math on a rank's tokens: scores, top-k, weights, capacity, and its backward
with the balancing losses (Megatron-Core `moe/router.py` `TopKRouter`, `moe/moe_utils.py`
`topk_routing_with_score_function`, `switch_load_balancing_loss_func`, `z_loss_func`).

scores = softmax(logits) or sigmoid(logits) over the experts [n, E]; the k experts of a
token are the largest scores + expert bias (the bias steers the choice only, DeepSeek-V3
2.1.2), optionally among the best `group_top_k` groups (group score: the sum of a group's
top k / group_top_k scores); a choice's weight is its score, divided by the sum of the k
when normalised (always for softmax after top-k), times `topk_scale`. With a capacity
factor each expert keeps the `capacity` choices of the rank's tokens with the largest
weights ("probs" drop policy) and the others carry weight 0.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .config import MoeConfig

EPS = 1e-20                     # Megatron's sigmoid normalisation guard


class Routing(NamedTuple):
    """What a rank's router chose for its n tokens, and what backward needs."""

    logits: np.ndarray          # [n, E]
    scores: np.ndarray          # [n, E] softmax / sigmoid of the logits
    chosen: np.ndarray          # [n, k] expert of each choice, best first
    weights: np.ndarray         # [n, k] combine weights, 0 where capacity dropped the choice
    kept: np.ndarray            # [n, k] bool


def normalises(moe: MoeConfig) -> bool:
    """Whether the k weights are divided by their sum (softmax after top-k always is)."""
    return moe.normalize or (moe.score == "softmax" and not moe.pre_softmax)


def scores_of(logits: np.ndarray, moe: MoeConfig) -> np.ndarray:
    """softmax or sigmoid of the router logits, per token."""
    if moe.score == "sigmoid":
        return 1.0 / (1.0 + np.exp(-logits))
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def choose(key: np.ndarray, moe: MoeConfig) -> np.ndarray:
    """The top-k experts of each token by `key` (scores + bias), best first, ties to the
    lower expert; within the best groups under group-limited routing."""
    n, E = key.shape
    if moe.groups > 1:
        per = max(moe.top_k // moe.group_top_k, 1)
        grouped = -np.sort(-key.reshape(n, moe.groups, -1), axis=-1)[..., :per].sum(-1)
        best = np.argsort(-grouped, axis=1, kind="stable")[:, :moe.group_top_k]  # [n, g]
        allowed = np.zeros((n, moe.groups), bool)
        np.put_along_axis(allowed, best, True, axis=1)
        key = np.where(np.repeat(allowed, E // moe.groups, axis=1), key, -np.inf)
    return np.argsort(-key, axis=1, kind="stable")[:, :moe.top_k]


def route(logits: np.ndarray, moe: MoeConfig, bias: np.ndarray | None) -> Routing:
    """Scores, choices and weights of a rank's tokens (capacity applied over them)."""
    scores = scores_of(logits, moe)
    chosen = choose(scores if bias is None else scores + bias, moe)
    raw = np.take_along_axis(scores, chosen, axis=1)
    w = raw / raw.sum(1, keepdims=True) if normalises(moe) else raw
    w = w * moe.topk_scale
    kept = keep_within_capacity(chosen, w, moe.capacity(len(logits)), moe.experts)
    return Routing(logits, scores, chosen, np.where(kept, w, 0.0), kept)


def keep_within_capacity(chosen: np.ndarray, w: np.ndarray, capacity: int, experts: int
                         ) -> np.ndarray:
    """[n, k] bool: the choices each expert keeps, its `capacity` largest weights (ties to
    the earlier token); all when dropless (capacity 0)."""
    kept = np.ones(chosen.shape, bool)
    if capacity == 0:
        return kept
    flat_e, flat_w = chosen.reshape(-1), w.reshape(-1)
    for e in range(experts):
        mine = np.flatnonzero(flat_e == e)
        if len(mine) > capacity:
            order = mine[np.argsort(-flat_w[mine], kind="stable")]
            kept.reshape(-1)[order[capacity:]] = False
    return kept


def counts(r: Routing, experts: int) -> np.ndarray:
    """Tokens each expert receives from this rank (kept choices)."""
    return np.bincount(r.chosen[r.kept], minlength=experts).astype(np.int64)


def chosen_counts(r: Routing, experts: int) -> np.ndarray:
    """Choices per expert before capacity (the auxiliary loss's f_i)."""
    return np.bincount(r.chosen.reshape(-1), minlength=experts).astype(np.int64)


def aux_counts(r: Routing, moe: MoeConfig, batch: int) -> np.ndarray:
    """[groups, E]: this rank's choices per expert (before capacity) for each group the
    auxiliary loss balances: the micro-batch ("global"), or each of its `batch` sequences
    ("seq"; row i of a rank holds sequence i mod batch: rows are position-major)."""
    if moe.aux_loss == "global":
        return chosen_counts(r, moe.experts)[None]
    seq = np.repeat(np.arange(len(r.chosen)) % batch, moe.top_k)
    out = np.zeros((batch, moe.experts), np.int64)
    np.add.at(out, (seq, r.chosen.reshape(-1)), 1)
    return out


def aux_score_grad(r: Routing, moe: MoeConfig, group_counts: np.ndarray, tokens: int,
                   scale: float) -> np.ndarray:
    """d(aux)/d(scores) [n, E] of the balancing loss over groups of T tokens whose choices
    per expert are `group_counts` [groups, E] (summed over the ranks holding them): per
    group aux = coeff E / (k T^2) sum_e P_e c_e, P_e the sum of the group's (normalised,
    for sigmoid) scores (Megatron-Core `switch_load_balancing_loss_func`; DeepSeek-V3 Eq.
    17-20 per sequence, averaged over the micro-batch's sequences); times the loss's
    `scale`. `tokens`: the micro-batch's."""
    E, groups = moe.experts, len(group_counts)
    t = tokens // groups
    c = group_counts * (moe.aux_loss_coeff * E / (moe.top_k * t * t * groups) * scale)
    dp = c[np.arange(len(r.scores)) % groups]
    if moe.score == "softmax":
        return np.array(dp)
    s = r.scores                                       # aux reads s / sum(s)
    total = s.sum(1, keepdims=True) + EPS
    return dp / total - (dp * s).sum(1, keepdims=True) / (total * total)


def route_back(r: Routing, dweights: np.ndarray, moe: MoeConfig, daux: np.ndarray | None,
               z_scale: float) -> np.ndarray:
    """d(loss)/d(logits) [n, E]: through the weights (normalisation, scale, capacity mask),
    the auxiliary loss's score gradient `daux`, the scores, and the z-loss
    coeff / T sum_t logsumexp(logits_t)^2 (`z_scale` = coeff / T x the loss's scale)."""
    raw = np.take_along_axis(r.scores, r.chosen, axis=1)
    dw = dweights * r.kept * moe.topk_scale
    if normalises(moe):
        z = raw.sum(1, keepdims=True)
        draw = dw / z - (dw * raw).sum(1, keepdims=True) / (z * z)
    else:
        draw = dw
    ds = np.zeros_like(r.scores) if daux is None else daux
    np.put_along_axis(ds, r.chosen, np.take_along_axis(ds, r.chosen, 1) + draw, axis=1)
    s = r.scores
    if moe.score == "softmax":
        dlogits = s * (ds - (ds * s).sum(1, keepdims=True))
    else:
        dlogits = ds * s * (1.0 - s)
    if z_scale:
        mx = r.logits.max(1, keepdims=True)
        e = np.exp(r.logits - mx)
        lse = mx + np.log(e.sum(1, keepdims=True))
        dlogits = dlogits + z_scale * 2.0 * lse * (e / e.sum(1, keepdims=True))
    return dlogits

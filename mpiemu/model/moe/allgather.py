"""The all-gather dispatcher's side of an MoE layer (Megatron-Core `token_dispatcher.py`
`MoEAllGatherTokenDispatcher`): every expert-TP x EP rank's tokens and routing gathered (its
tp_ep_group; the EP group without expert TP), each rank runs its experts (their expert-TP
slices) on the gathered tokens routed to them, weights them, and a reduce-scatter sums the
partial outputs back to the tokens' owners. Moves etp x ep x n x H rows whatever the
routing; no counts need exchanging first. Backward: the output gradient gathered, the
input and weight gradients reduce-scattered."""
from __future__ import annotations

import numpy as np

from ..block import Cache, Params
from ..executor import Array, Ready
from .dispatch import ExpertLayer, Plan
from .router import Routing

IDS = 8


def gather_forward(lay: ExpertLayer, y: Array, r: Routing | None, plan: Plan, P: Params,
                   c: Cache) -> Array:
    """[n, H]: this rank's tokens' routed output."""
    E, ep, n, h, k = lay.E, lay.gather_group, lay.d.shard_rows, lay.d.hidden, lay.moe.top_k
    size = 1 if ep is None else ep.size
    xg, chosen, w = y, None, None
    if ep is not None and size > 1:
        xg = E.all_gather(ep, f"{lay.tag}.dispatch", None if y is None else y.reshape(-1),
                          n * h, E.e)
        # the routing map and weights (Megatron gathers them beside the tokens)
        E.all_gather(ep, f"{lay.tag}.dispatch.routing", None, n * k, IDS + E.e)
    if r is not None:
        pairs = [(np.where(r.kept, r.chosen, -1), r.weights)]
        if ep is not None and size > 1:
            pairs = ep.comm.allgather(pairs[0])                # host-side, beside the bytes
        chosen = np.concatenate([p[0] for p in pairs])         # [size n, k]
        w = np.concatenate([p[1] for p in pairs])
        xg = np.asarray(xg).reshape(size * n, h)
    picks = _picks(lay, chosen)
    rows = sum(plan.expert_rows())
    xs = E.kernel(f"{lay.tag}.permute.fwd", lay._move_cost(rows),
                  lambda: [xg[t] for t, _ in picks])          # type: ignore[index]
    os = lay.experts_forward(xs, plan.expert_rows(), P, c)
    yg = E.kernel(f"{lay.tag}.unpermute.fwd", lay._move_cost(rows, weights=True),
                  _weighted_sum, os, picks, w, size * n)
    c.update(picks=picks, w=w, yo=os, size=size)
    return _scatter(lay, "combine", yg, size)


def gather_backward(lay: ExpertLayer, dm: Array, c: Cache, P: Params, G: Params,
                    ready: Ready) -> tuple[Array, Array]:
    """(d tokens [n, H], d weights [n, k])."""
    E, ep, n, h, k = lay.E, lay.gather_group, lay.d.shard_rows, lay.d.hidden, lay.moe.top_k
    size, picks, w = c["size"], c["picks"], c["w"]
    dg = dm
    if ep is not None and size > 1:
        dg = E.all_gather(ep, f"{lay.tag}.combine.bwd", None if dm is None else dm.reshape(-1),
                          n * h, E.e)
    dg = None if dg is None else np.asarray(dg).reshape(size * n, h)
    rows = sum(c["plan"].expert_rows())
    both = E.kernel(f"{lay.tag}.unpermute.bwd", lay._move_cost(rows, weights=True),
                    _weighted_sum_back, dg, c["yo"], picks, w)
    dos, dwg = both if both is not None else (None, None)
    dxs = lay.experts_backward(dos, c, P, G, ready)
    dxg = E.kernel(f"{lay.tag}.permute.bwd", lay._move_cost(rows), _scatter_rows, dxs, picks,
                   size * n, h)
    dx = _scatter(lay, "dispatch.bwd", dxg, size)
    dw = dwg
    if ep is not None and size > 1:
        dw = E.reduce_scatter(ep, f"{lay.tag}.dispatch.routing.bwd",
                              None if dwg is None else dwg.reshape(-1), size * n * k, E.e)
    return dx, None if dw is None else np.asarray(dw).reshape(n, k)


def _picks(lay: ExpertLayer, chosen: np.ndarray | None) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per local expert: (gathered token rows, their choice slots), in gathered order."""
    if chosen is None:
        return []
    out = []
    for e in lay.mine:
        t, j = np.nonzero(chosen == e)
        out.append((t, j))
    return out


def _weighted_sum(os: list[np.ndarray], picks: list[tuple[np.ndarray, np.ndarray]],
                  w: np.ndarray, rows: int) -> np.ndarray:
    """[rows, H]: this rank's experts' outputs times their weights, at their tokens."""
    out = np.zeros((rows, os[0].shape[1]) if os else (rows, 0))
    for o, (t, j) in zip(os, picks):
        np.add.at(out, t, o * w[t, j][:, None])
    return out


def _weighted_sum_back(dg: np.ndarray, os: list[np.ndarray],
                       picks: list[tuple[np.ndarray, np.ndarray]], w: np.ndarray
                       ) -> tuple[list[np.ndarray], np.ndarray]:
    """(d outputs per local expert, d weights [rows, k], this rank's choices only)."""
    dw = np.zeros(w.shape)
    dos = []
    for o, (t, j) in zip(os, picks):
        dw[t, j] = (dg[t] * o).sum(1)
        dos.append(dg[t] * w[t, j][:, None])
    return dos, dw


def _scatter_rows(dxs: list[np.ndarray], picks: list[tuple[np.ndarray, np.ndarray]],
                  rows: int, h: int) -> np.ndarray:
    out = np.zeros((rows, h))
    for d, (t, _) in zip(dxs, picks):
        np.add.at(out, t, d)
    return out


def _scatter(lay: ExpertLayer, name: str, x: Array, size: int) -> Array:
    """Sum [size n, H] partials over expert TP x EP, each rank keeping its own n rows."""
    n, h = lay.d.shard_rows, lay.d.hidden
    if lay.gather_group is None or size == 1:
        return x
    out = lay.E.reduce_scatter(lay.gather_group, f"{lay.tag}.{name}",
                               None if x is None else x.reshape(-1), size * n * h, lay.E.e)
    return None if out is None else np.asarray(out).reshape(n, h)

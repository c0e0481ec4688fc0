"""The all-to-all dispatcher's side of an MoE layer (Megatron-Core `token_dispatcher.py`
`MoEAlltoAllTokenDispatcher`): the rank's kept choices permuted expert-major, sent to the
ranks holding their experts in one all-to-all-v, regrouped per local expert (and gathered
over expert TP, `expert_tp`); the outputs back the same way and summed per token with their
weights. Backward runs the conjugates."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..block import Cache, Params
from ..executor import Array, Ready
from ..steps import Steps
from .dispatch import ExpertLayer, Plan, by_expert, by_source, permute, split_rows, unpermute
from .expert_tp import gather_rows, scatter_rows
from .router import Routing


def alltoall_forward(lay: ExpertLayer, y: Array, r: Routing | None, plan: Plan, P: Params,
                     c: Cache) -> Steps[Array]:
    """[n, H]: this rank's tokens' routed output."""
    E, k, n = lay.E, lay.moe.top_k, lay.d.shard_rows
    rows = int(plan.counts[plan.rank].sum())
    xp = E.kernel(f"{lay.tag}.permute.fwd", lay._move_cost(rows), permute, y,
                  None if r is None else plan.order, k)
    xs = yield from exchange(lay, "dispatch", xp, plan.send_rows(), plan.recv_rows(), plan,
                             side=c.get("side"))
    xs = gather_rows(lay, "dispatch.etp", xs, plan)
    os = lay.experts_forward(xs, plan.expert_rows(), P, c)
    os = scatter_rows(lay, "combine.etp", os, plan)
    yp = yield from exchange(lay, "combine", os, plan.recv_rows(), plan.send_rows(), plan,
                             groups=True)
    c["yp"] = yp
    return E.kernel(f"{lay.tag}.unpermute.fwd", lay._move_cost(rows, weights=True), unpermute,
                    yp, None if r is None else plan.order, None if r is None else r.weights, n)


def alltoall_backward(lay: ExpertLayer, dm: Array, c: Cache, P: Params, G: Params,
                      ready: Ready) -> Steps[tuple[Array, Array]]:
    """(d tokens [n, H], d weights [n, k])."""
    E, plan, n = lay.E, c["plan"], lay.d.shard_rows
    rows = int(plan.counts[plan.rank].sum())
    both = E.kernel(f"{lay.tag}.unpermute.bwd", lay._move_cost(rows, weights=True),
                    _unpermute_back, dm, c["yp"], c["r"], plan)
    dyp, dweights = both if both is not None else (None, None)
    dos = yield from exchange(lay, "combine.bwd", dyp, plan.send_rows(), plan.recv_rows(),
                              plan, side=c.get("side"))
    dos = gather_rows(lay, "combine.bwd.etp", dos, plan)
    dxs = lay.experts_backward(dos, c, P, G, ready)
    dxs = scatter_rows(lay, "dispatch.bwd.etp", dxs, plan)
    dxp = yield from exchange(lay, "dispatch.bwd", dxs, plan.recv_rows(), plan.send_rows(),
                              plan, groups=True)
    dx = E.kernel(f"{lay.tag}.permute.bwd", lay._move_cost(rows), _permute_back, dxp, plan, n,
                  lay.moe.top_k)
    return dx, dweights


def exchange(lay: ExpertLayer, name: str, x: Any, send: list[int], recv: list[int], plan: Plan,
             groups: bool = False, side: Callable[[], Any] | None = None) -> Steps[Any]:
    """An all-to-all-v over EP of rows [sum send, H] (or per-expert groups, regrouped by
    source first); the received rows per local expert (or concatenated). `side`: work
    independent of it, run while it moves (start -> side -> wait); the step yields while
    it moves too (another micro-batch's work: the combined 1F1B schedule)."""
    E, h = lay.E, lay.d.hidden
    chunks = None
    if E.on:
        chunks = by_source(x, plan) if groups else split_rows(x, send)
    if lay.ep is None or lay.ep.size == 1:
        got = chunks
    else:
        got, t_end = E.all_to_all_start(lay.ep, f"{lay.tag}.{name}", chunks, send, recv, h,
                                        E.e)
        if side is not None:
            side()        # the shared experts need none of these tokens: under the bytes
        yield             # so may another micro-batch's pass (combined 1F1B)
        E.wait_until(t_end)
    if got is None:
        return None
    return np.concatenate(got) if groups else by_expert(got, plan)


def _unpermute_back(dm: np.ndarray, yp: np.ndarray, r: Routing, plan: Plan
                    ) -> tuple[np.ndarray, np.ndarray]:
    """(d expert outputs [rows, H], d weights [n, k]) of `unpermute`."""
    k = r.weights.shape[1]
    rows = dm[plan.order // k]
    dw = np.zeros(r.weights.size)
    dw[plan.order] = (rows * yp).sum(1)
    return rows * r.weights.reshape(-1)[plan.order][:, None], dw.reshape(r.weights.shape)


def _permute_back(dxp: np.ndarray, plan: Plan, n: int, k: int) -> np.ndarray:
    """d tokens [n, H]: each kept choice's input gradient summed into its token."""
    dx = np.zeros((n, dxp.shape[1]), dxp.dtype)
    np.add.at(dx, plan.order // k, dxp)
    return dx

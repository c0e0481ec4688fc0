"""A layer's Mixture-of-Experts MLP on one rank: router, dispatch, grouped experts, combine,
shared experts (Megatron-Core `moe/moe_layer.py` `MoELayer` with the all-to-all dispatcher).

The rank routes its own tokens (its sequence shard under SP: Megatron-Core requires SP with
TP and experts), exchanges them with its expert-parallel group (`dispatch`), runs the
experts it holds as grouped GEMMs (each expert its own M), sends the outputs back and sums
each token's k outputs times their weights. Under expert tensor parallelism each expert's
FFN is split over the expert-TP group, which gathers its members' received rows before the
experts and reduce-scatters the partial outputs after (`expert_tp`). Shared experts
(DeepSeek) are a dense, TP-sharded MLP every token passes, added to the routed output.
Activations are [rows, H].
"""
from __future__ import annotations

import numpy as np

from ..block import Block, Cache, Params, acc, transposed
from ..config import ModelConfig
from ..dims import Dims
from ..executor import Array, Executor, Ready
from ..masks import Masks
from ..mlp import Mlp
from ..ops import Cost, swiglu, swiglu_back, swiglu_cost
from ..steps import Steps
from .allgather import gather_backward, gather_forward
from .alltoall import alltoall_backward, alltoall_forward
from .dispatch import Plan
from .router import Routing, aux_counts, aux_score_grad, counts, route, route_back
from .state import MoeRun

IDS = 8                               # bytes of a token index or a count (int64)


class MoeMlp(Block):
    """Forward and backward of layer `index`'s experts on one rank."""

    def __init__(self, ex: Executor, cfg: ModelConfig, dims: Dims, index: int,
                 run: MoeRun, positions: np.ndarray | None = None) -> None:
        super().__init__(ex, cfg, dims, index, positions=positions)
        assert cfg.moe is not None
        self.moe, self.run, self.ep = cfg.moe, run, ex.ep      # ep None: every expert here
        self.etp = ex.etp                                      # None: experts whole
        # the all-gather dispatcher's group: expert TP x EP (Megatron-Core's tp_ep_group)
        self.gather_group = ex.etp_ep
        ep_size, ep_rank = (1, 0) if ex.ep is None else (ex.ep.size, ex.ep.rank)
        self.per_rank = self.moe.experts // ep_size
        self.mine = range(ep_rank * self.per_rank, (ep_rank + 1) * self.per_rank)
        self.fl = self.moe.expert_ffn // (1 if ex.etp is None else ex.etp.size)  # FFN slice
        self.shared: Mlp | None = None
        if self.moe.shared_ffn:
            self.shared = Mlp(ex, cfg, dims._replace(ffn=self.moe.shared_ffn // dims.tp), index)
            self.shared.p, self.shared.tag = self.p + "shared.", self.tag + ".shared"

    def _w(self, P: Params, part: str) -> list[Array]:
        return [P.get(f"{self.p}experts.{e}.{part}.w") for e in self.mine]

    # -- forward ----------------------------------------------------------------------------
    def forward_steps(self, y: Array, P: Params, masks: Masks) -> Steps[tuple[Array, Cache]]:
        """[n, H] routed (and shared) output and the cache; yields while an all-to-all
        moves (another micro-batch's work may run then: the combined 1F1B schedule)."""
        d, E, moe = self.d, self.E, self.moe
        n, h = d.shard_rows, d.hidden
        logits = E.gemm(f"{self.tag}.router.fwd", y, P[self.p + "router.w"], n, moe.experts, h)
        r: Routing | None = E.kernel(f"{self.tag}.router.topk", self._router_cost(n), route,
                                     logits, moe, self.run.bias_of(self.i))
        tokens = self._tokens(masks.samples.start)
        local = counts(r, moe.experts) if r is not None else self.run.timing_counts(
            self.i, masks.samples.start, self._rank_key(), tokens)
        self.run.routed(self.i, local, tokens, None if r is None else
                        np.where(r.kept, r.chosen, -1))
        plan = self._plan(local, r)
        c: Cache = {"y": y, "r": r, "plan": plan}
        if moe.aux_loss_coeff and moe.aux_loss != "none":
            groups = d.batch if moe.aux_loss == "seq" else 1
            c["group_counts"] = self._group_sum("router.aux_counts", None if r is None else
                                                aux_counts(r, moe, d.batch), groups)
        shared = self.shared
        if shared is not None and self._overlapped():       # under the dispatch all-to-all
            c["side"] = lambda: c.update(zip(("shared_out", "shared"), shared.forward(y, P)))
        if self.run.dispatcher == "allgather":
            out = gather_forward(self, y, r, plan, P, c)
        else:
            out = yield from alltoall_forward(self, y, r, plan, P, c)
        if shared is not None:
            s = c.pop("shared_out") if "shared_out" in c else None
            if s is None:
                s, c["shared"] = shared.forward(y, P)
            out = E.kernel(f"{self.tag}.shared.add", Cost(n * h, 2 * n * h * E.e, n * h * E.e),
                           np.add, out, s)
        return out, c

    def _overlapped(self) -> bool:
        """Shared experts run while the dispatch all-to-all moves (forward) and while the
        combine's gradient moves (backward): Megatron-Core --moe-shared-expert-overlap."""
        return self.run.shared_overlap and self.run.dispatcher == "alltoall" and \
            self.ep is not None and self.ep.size > 1

    def _tokens(self, sample0: int) -> np.ndarray:
        """Global ids (sample x seq_len + position) of this rank's rows: position-major
        over the micro-batch's samples, this TP rank's slice of them under SP."""
        d = self.d
        first = self.E.tp.rank * d.shard_rows if d.sp else 0
        rows = np.arange(first, first + d.shard_rows)
        return (sample0 + rows % d.batch) * self.cfg.seq_len + self.positions[rows // d.batch]

    def _rank_key(self) -> int:
        """Which of a micro-batch's token sets this rank holds (its TP and CP place)."""
        return self.E.tp.rank + self.d.tp * (0 if self.E.cp is None else self.E.cp.rank)

    def _plan(self, local: np.ndarray, r: Routing | None) -> Plan:
        """Every EP rank's counts (all-gathered over expert TP x EP, Megatron's
        `preprocess`) and this rank's permutation: kept choices expert-major in token
        order."""
        from ...comm.folded import FoldedComm  # noqa: PLC0415  (MPI: only where a run has EP)
        E, g = self.E, self.gather_group
        every = local[None]
        if g is not None and g.size > 1:
            E.all_gather(g, f"{self.tag}.dispatch.counts", None, self.moe.experts, IDS)
            every = np.tile(local, (g.size, 1)) if isinstance(g.comm, FoldedComm) else \
                np.stack(g.comm.allgather(local))      # the counts' values, host-side (folded:
                                                       # balanced, every image's the same)
        order = np.zeros(0, np.int64)
        if r is not None:
            flat = np.flatnonzero(r.kept.reshape(-1))
            order = flat[np.argsort(r.chosen.reshape(-1)[flat], kind="stable")]
        ep = 0 if self.ep is None else self.ep.rank
        if self.etp is None:
            return Plan(order, every, ep, self.per_rank)
        j = self.etp.rank
        peers = every.reshape(-1, self.etp.size, self.moe.experts).transpose(1, 0, 2)
        return Plan(order, peers[j], ep, self.per_rank, peers, j)   # group order: j + etp e

    def _group_sum(self, name: str, x: np.ndarray | None, groups: int) -> np.ndarray | None:
        """Sum a per-expert vector over the ranks holding one micro-batch's tokens (TP
        under SP, CP): the auxiliary loss's counts (Megatron-Core reduces them over its
        tensor-and-context-parallel group)."""
        E, k = self.E, self.moe.experts * groups
        y = None if x is None else x.reshape(-1).astype(np.float64)
        if self.d.sp:
            y = E.tp_sum(f"{self.tag}.{name}.tp", y, k, IDS)
        if E.cp is not None:
            y = E.all_reduce(E.cp, f"{self.tag}.{name}.cp", y, k, IDS)
        return None if y is None else y.reshape(groups, -1)

    def _router_cost(self, n: int) -> list[Cost]:
        """Score, top-k and weights: read the logits, write scores, choices and weights
        (Megatron-Core's fused router kernels: `moe_router_fusion`)."""
        E, k, e = self.moe.experts, self.moe.top_k, self.E.e
        return [Cost(8 * n * E, n * E * e, n * E * e + n * k * (e + IDS), sfu_ops=n * E)]

    def _move_cost(self, rows: int, weights: bool = False) -> Cost:
        """A permute (gather of rows) or unpermute (weighted scatter-add) of `rows` rows."""
        h, e = self.d.hidden, self.E.e
        extra = rows * (e + IDS) if weights else rows * IDS
        return Cost(2 * rows * h if weights else 0, rows * h * e + extra, rows * h * e)

    # -- backward ---------------------------------------------------------------------------
    def backward_steps(self, dm: Array, c: Cache, P: Params, G: Params, with_bias: list[str],
                       ready: Ready) -> Steps[Array]:
        """d input [n, H]; the weights' gradients into G; yields while an all-to-all moves."""
        n, h, E, shared = self.d.shard_rows, self.d.hidden, self.E, self.shared
        c["side"] = None
        if shared is not None and self._overlapped():   # under the combine's gradient's
            c["side"] = lambda: c.update(ds=shared.backward(dm, c["shared"], P, G, [], ready))
        elif shared is not None:
            c["ds"] = shared.backward(dm, c["shared"], P, G, [], ready)
        if self.run.dispatcher == "allgather":
            dx, dweights = gather_backward(self, dm, c, P, G, ready)
        else:
            dx, dweights = yield from alltoall_backward(self, dm, c, P, G, ready)
        ds = c.get("ds")
        dx = self._router_back(dx, dweights, c, P, G, ready)
        if ds is not None:
            dx = E.kernel(f"{self.tag}.shared.residual.bwd",
                          Cost(n * h, 2 * n * h * E.e, n * h * E.e), np.add, dx, ds)
        return dx

    def experts_forward(self, xs: list[Array] | None, ms: list[int], P: Params, c: Cache
                        ) -> list[Array] | None:
        """The rank's experts (their expert-TP slices) on their rows (one grouped GEMM per
        projection), kept in `c` for backward: the outputs per local expert (partial sums
        over expert TP)."""
        E, h, f = self.E, self.d.hidden, self.fl
        hs = E.grouped_gemm(f"{self.tag}.experts.fc1.fwd", xs, self._w(P, "fc1"),
                            [(m, 2 * f, h) for m in ms])
        acts = E.kernel(f"{self.tag}.experts.swiglu.fwd",
                        swiglu_cost(sum(ms), f, E.e, E.kernels.mode, False),
                        lambda: [swiglu(x, None)[1] for x in hs or []])   # type: ignore[arg-type]
        c.update(xs=xs, hs=hs, acts=acts, ms=ms)
        return E.grouped_gemm(f"{self.tag}.experts.fc2.fwd", acts, self._w(P, "fc2"),
                              [(m, h, f) for m in ms])

    def experts_backward(self, dos: list[Array] | None, c: Cache, P: Params, G: Params,
                         ready: Ready) -> list[Array] | None:
        """The experts' input gradients per local expert; their weights' into G."""
        E, h, f, ms = self.E, self.d.hidden, self.fl, c["ms"]
        dacts = E.grouped_gemm(f"{self.tag}.experts.fc2.bwd", dos,
                               [transposed(w) for w in self._w(P, "fc2")],
                               [(m, f, h) for m in ms])
        self._wgrads(G, "fc2", [transposed(a) for a in c["acts"] or []] or None, dos,
                     [(f, h, m) for m in ms], ready)
        dhs = E.kernel(f"{self.tag}.experts.swiglu.bwd",
                       swiglu_cost(sum(ms), f, E.e, E.kernels.mode, False, backward=True),
                       lambda: [swiglu_back(g, x)[0]                    # type: ignore[arg-type]
                                for g, x in zip(dacts or [], c["hs"])])
        dxs = E.grouped_gemm(f"{self.tag}.experts.fc1.bwd", dhs,
                             [transposed(w) for w in self._w(P, "fc1")],
                             [(m, h, 2 * f) for m in ms])
        self._wgrads(G, "fc1", [transposed(x) for x in c["xs"] or []] or None, dhs,
                     [(h, 2 * f, m) for m in ms], ready)
        return dxs

    def _wgrads(self, G: Params, part: str, xs_t: list[Array] | None, dys: list[Array] | None,
                shapes: list[tuple[int, int, int]], ready: Ready) -> None:
        grads = self.E.grouped_gemm(f"{self.tag}.experts.{part}.wgrad", xs_t, dys, shapes)
        names = [f"{self.p}experts.{e}.{part}.w" for e in self.mine]
        for name, g in zip(names, grads or [None] * len(names)):
            acc(G, name, g)
        ready(names)

    def _router_back(self, dx: Array, dweights: Array, c: Cache, P: Params, G: Params,
                     ready: Ready) -> Array:
        """Through the routing (weights, auxiliary and z losses) to the logits, then the
        router GEMM's input and weight gradients."""
        d, E, moe, run = self.d, self.E, self.moe, self.run
        n, h = d.shard_rows, d.hidden
        tokens = d.seq * d.cp * d.batch                   # the micro-batch's, over TP and CP
        scale = d.batch / run.global_batch                # its share of the step's mean loss
        r = c["r"]
        daux = None
        if r is not None and c.get("group_counts") is not None:
            daux = aux_score_grad(r, moe, c["group_counts"], tokens, scale)
        z = moe.z_loss_coeff / tokens * scale
        dlogits = E.kernel(f"{self.tag}.router.bwd", self._router_cost(n), route_back, r,
                           dweights, moe, daux, z)
        dr = E.gemm(f"{self.tag}.router.dgrad", dlogits,
                    transposed(P[self.p + "router.w"]), n, h, moe.experts)
        acc(G, self.p + "router.w", E.wgrad(f"{self.tag}.router.wgrad", transposed(c["y"]),
                                            dlogits, h, moe.experts, n))
        ready([self.p + "router.w"])
        return E.kernel(f"{self.tag}.router.residual.bwd",
                        Cost(n * h, 2 * n * h * E.e, n * h * E.e), np.add, dx, dr)

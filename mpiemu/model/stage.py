"""A rank's pipeline stage of the transformer: its parameters and their gradients, and the
forward and backward of one micro-batch on one model chunk.

Vocab-parallel embedding on the first stage, tied with the LM head and vocab-parallel
cross-entropy on the last (Megatron VocabParallelEmbedding / _VocabParallelCrossEntropy;
with pp > 1 both ends hold the table), the layers of `layers.py` in between. Gradients
accumulate over micro-batches in `G`; backward tells its `hooks` when a micro-batch's
gradient of a parameter is computed, and a forward when it is about to use a layer's
parameters: the training step (`training.gradients`) keeps Megatron's gradient buffer, the
DP buckets and the distributed optimizer's gathers there. Which passes run in which order
is the pipeline schedule's business (`training.pipeline_step`).
"""
from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from . import seeded
from .config import ModelConfig
from .context_parallel import positions as cp_positions
from .dims import Dims
from .executor import Array, Executor, Ready
from .block import Cache, Params, acc, norm_backward, norm_forward, transposed
from .layers import Layer
from .moe.state import MoeRun
from .masks import Masks
from .ops import (MASK_BYTES, Cost, bias_grad_cost, ce_back, ce_combine, ce_cost,
                  ce_local_stats, dropout, embed_cost, embed_lookup, embed_scatter)
from .pipeline_schedules import Pass
from .pipeline_split import LayerSplit, chunk_layers
from .steps import Steps
from .tensor_parallel import ExpertPlace, LocalParam, cut, expert_place, local_params

RECOMPUTE = ("none", "selective", "full")
EMBED_SIDE = ("wte", "wpe", "lne.g", "lne.b")      # parameters of the first virtual stage
HEAD_SIDE = ("lnf.g", "lnf.b")                     # ... and of the last, with its output
                                                   # layer (the table itself when tied)


def edge_names(cfg: ModelConfig, pp: int, stage: int) -> set[str]:
    """The embedding / head tensors (layer -1) a pipeline stage may hold."""
    head = HEAD_SIDE + (("wte",) if cfg.tied_embeddings else ("lm_head",))
    return set(EMBED_SIDE if stage == 0 else ()) | set(head if stage == pp - 1 else ())


def stage_params(cfg: ModelConfig, tp: int, pp: int, chunks: int, stage: int,
                 split: LayerSplit = LayerSplit(), place: ExpertPlace = ExpertPlace()
                 ) -> list[LocalParam]:
    """The local parameters a (TP rank, expert place, pipeline stage) holds, in forward
    order."""
    mine = {i for c in range(chunks)
            for i in chunk_layers(cfg.layers, pp, chunks, stage, c, split)}
    edge = edge_names(cfg, pp, stage)
    return [lp for lp in local_params(cfg, tp, place)
            if (lp.layer in mine) or (lp.layer == -1 and lp.name in edge)]


class StageHooks(Protocol):
    """What the training step does around a stage's passes (`training.gradients`)."""

    def params_needed(self, layer: int, upcoming: int | None = None,
                      backward: bool = False) -> None:
        """A pass is about to use layer `layer`'s parameters (-1: embedding, head);
        `upcoming`: the layer this pass uses next (None: the pass ends)."""

    def params_done(self, layer: int, backward: bool) -> None:
        """The pass is done with layer `layer`'s parameters."""

    def grads_ready(self, names: list[str], micro: int) -> None:
        """Backward of micro-batch `micro` has computed these parameters' gradients."""

    def grad_accumulated(self, name: str) -> None:
        """A weight-gradient GEMM added into `name`'s gradient; more of it follows in this
        micro-batch (the tied table: the head's part before the embedding's)."""


class NoHooks:
    """A stage outside a training step (forward and backward alone)."""

    def params_needed(self, layer: int, upcoming: int | None = None,
                      backward: bool = False) -> None:
        return None

    def params_done(self, layer: int, backward: bool) -> None:
        return None

    def grads_ready(self, names: list[str], micro: int) -> None:
        return None

    def grad_accumulated(self, name: str) -> None:
        return None


def _after(units: list[int], unit: int) -> int | None:
    """The unit a pass uses after `unit` (None: the last)."""
    i = units.index(unit)
    return units[i + 1] if i + 1 < len(units) else None


class StageModel:
    """Parameters, accumulated gradients and the passes of one (tp, dp, pp) rank."""

    def __init__(self, cfg: ModelConfig, ex: Executor, dims: Dims, *, tp_rank: int,
                 dp_rank: int, seed: int, global_batch: int, np_dtype: type, pp: int = 1,
                 pp_rank: int = 0, chunks: int = 1, micro_batches: int = 1,
                 recompute: str = "none", cp_rank: int = 0, cp_comm: str = "p2p",
                 split: LayerSplit = LayerSplit(), moe: MoeRun | None = None) -> None:
        self.cfg, self.E, self.d = cfg, ex, dims
        self.tp_rank, self.dp_rank, self.seed = tp_rank, dp_rank, seed
        self.pp, self.pp_rank, self.chunks = pp, pp_rank, chunks
        self.global_batch, self.micro_batches, self.recompute = global_batch, micro_batches, \
            recompute
        self.moe = moe                  # the MoE layers' shared state (None: dense)
        self.loss_scale = 1.0           # FP16: the step's loss scale (the optimizer's scaler)
        self.place = expert_place(ex)
        self.specs: list[LocalParam] = stage_params(cfg, dims.tp, pp, chunks, pp_rank, split,
                                                    self.place)
        self.by_name = {lp.name: lp for lp in self.specs}
        self.P: Params = {lp.name: self._init(lp, np_dtype) for lp in self.specs}
        self.G: Params = {lp.name: None for lp in self.specs}
        # the sequence positions of the rank's rows: its two chunks under CP
        self.seq_positions = cp_positions(cfg.seq_len, dims.cp, cp_rank) if dims.cp > 1 \
            else np.arange(dims.seq)
        self.chunk_layers = [[Layer(ex, cfg, dims, i, recompute, self.seq_positions, cp_comm,
                                    moe)
                              for i in chunk_layers(cfg.layers, pp, chunks, pp_rank, c, split)]
                             for c in range(chunks)]
        self.hooks: StageHooks = NoHooks()          # the training step's (`training.gradients`)
        self.head = "wte" if cfg.tied_embeddings else "lm_head"   # the output layer's table
        s_loc = dims.seq // dims.tp if dims.sp else dims.seq
        s0 = tp_rank * s_loc if dims.sp else 0
        self.shard_positions = self.seq_positions[s0:s0 + s_loc]     # this SP shard's
        self.positions = np.repeat(self.shard_positions, dims.batch)  # of each row
        self.vocab_lo = tp_rank * dims.vocab
        self.saved: dict[tuple[int, int], Any] = {}
        self.peak_saved = 0                          # most (micro-batch, chunk) kept at once
        self.iteration, self.loss = 0, 0.0
        self.keep_caches = False            # tests inspect what the last forward stored
        self.last_caches: tuple[Cache, list[Cache], Cache] | None = None

    def _init(self, lp: LocalParam, np_dtype: type) -> Array:
        if not self.E.on:
            return None
        full = [seeded.init_tensor(self.cfg, self.seed, n, s, i, np_dtype)
                for n, s, i in seeded.full_param_specs(self.cfg) if n in lp.full]
        return cut(lp, full, self.place.etp_rank if lp.expert else self.tp_rank, self.cfg)

    def units(self, chunk: int, backward: bool = False) -> list[int]:
        """The parameter units a pass of chunk `chunk` uses, in order: its layers, and the
        embedding and head's (-1) where the pass first meets them (forward: the embedding
        first, else the head last; backward: the head first, else the embedding last)."""
        layers = [layer.i for layer in self.chunk_layers[chunk]]
        starts, ends = (self.last_virtual, self.first_virtual) if backward else \
            (self.first_virtual, self.last_virtual)
        return ([-1] if starts(chunk) else []) + (layers[::-1] if backward else layers) + \
            ([-1] if ends(chunk) and not starts(chunk) else [])

    def first_virtual(self, chunk: int) -> bool:
        return chunk == 0 and self.pp_rank == 0

    def last_virtual(self, chunk: int) -> bool:
        return chunk == self.chunks - 1 and self.pp_rank == self.pp - 1

    # -- one step: begin, passes (in the schedule's order), finish ---------------------------
    def begin_step(self, iteration: int) -> None:
        self.iteration, self.loss = iteration, 0.0
        if self.moe is not None:
            self.moe.begin_step(iteration)
        self.G = {lp.name: None for lp in self.specs}
        self.saved.clear()

    def _first_sample(self, micro: int) -> int:
        return seeded.first_sample(self.dp_rank, micro, self.micro_batches, self.d.batch)

    def _masks(self, micro: int) -> Masks:
        """The dropout masks of micro-batch `micro` of this DP rank (drawn lazily)."""
        return Masks(self.cfg, self.seed, self.iteration, self.d, self._first_sample(micro),
                     self.tp_rank, self.E.on, self.seq_positions)

    def _tokens(self, micro: int, chunk: int) -> tuple[Array, Array]:
        """Token ids and targets of micro-batch `micro`, where chunk `chunk` uses them (the
        embedding's and the LM head's), numerics on; None otherwise."""
        if not self.E.on or not (self.first_virtual(chunk) or self.last_virtual(chunk)):
            return None, None
        lo = self._first_sample(micro)
        tok, tgt = seeded.batch(self.cfg, self.seed, self.iteration, self.global_batch,
                                lo, lo + self.d.batch)
        pos = self.seq_positions                                       # the rank's (CP)
        return tok[:, pos].T.reshape(-1), tgt[:, pos].T.reshape(-1)    # (S*B,) position-major

    def forward_steps(self, ps: Pass, x: Array) -> Steps[Array]:
        """Forward of micro-batch ps.micro through chunk ps.chunk: its output (None on the
        last virtual stage, whose loss share is added to `self.loss`), as steps that yield
        while an expert all-to-all moves (`steps.drain` runs it alone)."""
        ex, c = self.E, ps.chunk
        masks, (ids, targets) = self._masks(ps.micro), self._tokens(ps.micro, c)
        c_emb: Cache = {}
        caches: list[Any] = []
        hooks, units = self.hooks, self.units(c)
        # its activations count from its start to its backward's end (two passes at once
        # under the combined 1F1B schedule)
        self.saved[(ps.micro, c)] = None
        self.peak_saved = max(self.peak_saved, len(self.saved))
        with ex.labelled(phase="fwd"):
            if self.first_virtual(c):
                with ex.labelled(layer=-1):
                    hooks.params_needed(-1, _after(units, -1))
                    x, c_emb = self._embed(ids, masks)
            for layer in self.chunk_layers[c]:
                with ex.labelled(layer=layer.i):
                    hooks.params_needed(layer.i, _after(units, layer.i))
                    x_in = x
                    x, cache = yield from layer.forward_steps(x, self.P, masks)
                hooks.params_done(layer.i, backward=False)
                # full recompute keeps the layer's input only (Korthikanti et al. 2022, 2)
                caches.append({"input": x_in} if self.recompute == "full" else cache)
            c_head: Cache = {}
            if self.last_virtual(c):
                with ex.labelled(layer=-1):
                    hooks.params_needed(-1)
                    loss, c_head = self._head(x, targets)
                self.loss += loss
                x = None
            if -1 in units:
                hooks.params_done(-1, backward=False)
        self.saved[(ps.micro, c)] = (c_emb, caches, c_head, ids, targets)
        if self.keep_caches:
            self.last_caches = (c_emb, caches, c_head)
        return x

    def backward_steps(self, ps: Pass, dy: Array) -> Steps[Array]:
        """Backward of micro-batch ps.micro through chunk ps.chunk: the input gradient, as
        steps that yield while an expert all-to-all moves."""
        ex, c = self.E, ps.chunk
        c_emb, caches, c_head, ids, targets = self.saved[(ps.micro, c)]
        masks = self._masks(ps.micro)
        hooks = self.hooks

        def ready(names: list[str]) -> None:
            hooks.grads_ready(names, ps.micro)
        units = self.units(c, backward=True)
        with ex.labelled(phase="bwd"):
            if self.last_virtual(c):
                with ex.labelled(layer=-1):
                    hooks.params_needed(-1, _after(units, -1), backward=True)
                    dy = self._head_back(c_head, targets, ready)
            for layer, cache in zip(reversed(self.chunk_layers[c]), reversed(caches)):
                with ex.labelled(layer=layer.i):
                    hooks.params_needed(layer.i, _after(units, layer.i), backward=True)
                    if self.recompute == "full":       # the layer's forward again
                        with ex.labelled(phase="recompute"):
                            _, cache = yield from layer.forward_steps(cache["input"], self.P,
                                                                      masks)
                    dy = yield from layer.backward_steps(dy, cache, self.P, self.G, masks,
                                                         ready)
                hooks.params_done(layer.i, backward=True)
            if self.first_virtual(c):
                with ex.labelled(layer=-1):
                    hooks.params_needed(-1, backward=True)
                    self._embed_back(dy, c_emb, ids, ready)
                dy = None
            if -1 in units:
                hooks.params_done(-1, backward=True)
        del self.saved[(ps.micro, c)]
        return dy

    # -- embedding --------------------------------------------------------------------------
    def _embed(self, ids: Array, masks: Masks) -> tuple[Array, Cache]:
        d, E, cfg = self.d, self.E, self.cfg
        rows, h = d.shard_rows, d.hidden
        part = E.kernel("embed.lookup", embed_cost(d.rows, h, E.e), embed_lookup, self.P["wte"],
                        ids, self.vocab_lo)
        x = E.tp_reduce("embed", part, d.rows, h)          # all-reduce, or RS to sequence rows
        if cfg.position == "learned":
            x = E.kernel("embed.pos_add", Cost(rows * h, 2 * rows * h * E.e, rows * h * E.e),
                         self._add_positions, x)
        c: Cache = {}
        if cfg.norm == "post":
            x, c["lne"] = norm_forward(E, cfg, "lne", "lne", x, self.P, rows)
        p = cfg.hidden_dropout
        if p > 0:
            keep = masks.hidden(-1, "embed")
            if keep is not None:
                c["keep"] = keep
            x = E.kernel("embed.dropout", Cost(rows * h, rows * h * E.e,
                                               rows * h * (E.e + MASK_BYTES)), dropout, x, keep, p)
        return E.round(x), c           # the embedding's output, a tensor of the dtype

    def _add_positions(self, x: np.ndarray) -> np.ndarray:
        wpe = self.P["wpe"]
        assert wpe is not None
        return x + wpe[self.positions]

    def _embed_back(self, dx: Array, c: Cache, ids: Array, ready: Ready) -> None:
        d, E, cfg = self.d, self.E, self.cfg
        rows, h = d.shard_rows, d.hidden
        p = cfg.hidden_dropout
        if p > 0:
            dx = E.kernel("embed.dropout.bwd", Cost(rows * h, rows * h * (E.e + MASK_BYTES),
                                                    rows * h * E.e), dropout, dx, c.get("keep"), p)
        if cfg.norm == "post":
            dx = norm_backward(E, cfg, "lne", "lne", dx, c["lne"], self.P, self.G, rows, ready)
        if cfg.position == "learned":
            acc(self.G, "wpe", E.kernel("embed.pos.bwd", bias_grad_cost(rows, h, E.e),
                                        self._position_grad, dx))
            ready(["wpe"])
        full = E.tp_gather_rows("embed.bwd", dx, d.rows, h) if d.sp else dx
        if E.on and self.G["wte"] is None:
            self.G["wte"] = np.zeros_like(self.P["wte"])
        E.kernel("embed.scatter.bwd", embed_cost(d.rows, h, E.e, backward=True),
                 embed_scatter, self.G["wte"], ids, self.vocab_lo, full)
        ready(["wte"])

    def _position_grad(self, dx: np.ndarray) -> np.ndarray:
        d = self.d
        g = np.zeros((self.cfg.seq_len, d.hidden), dx.dtype)
        g[self.shard_positions] = dx.reshape(-1, d.batch, d.hidden).sum(1)   # (S_loc, H)
        return g

    # -- LM head and cross-entropy ----------------------------------------------------------
    def _head(self, x: Array, targets: Array) -> tuple[float, Cache]:
        d, E, cfg = self.d, self.E, self.cfg
        c: Cache = {}
        if cfg.norm == "pre":
            x, c["lnf"] = norm_forward(E, cfg, "lnf", "lnf", x, self.P, d.shard_rows)
        logits, _ = E.column_parallel("head.fwd", x, transposed(self.P[self.head]), d.rows,
                                      d.vocab, d.hidden)
        c["x"] = x                # the input (its sequence shard under SP: gathered again)
        c["logits"] = logits
        stats = E.kernel("head.ce.fwd", ce_cost(d.rows, d.vocab, E.e, E.kernels.mode),
                         ce_local_stats, logits, targets, self.vocab_lo)
        flat = None if stats is None else stats.reshape(1, -1)       # (1, 2 S*B) per rank
        every = E.tp_gather_rows("head.ce", flat, d.tp, 2 * d.rows, itemsize=4)
        if every is None:
            return 0.0, c
        lse, picked = ce_combine(every.reshape(d.tp, d.rows, 2))
        c["lse"] = lse
        n_tokens = self.global_batch * self.cfg.seq_len
        return float((lse - picked).sum() / n_tokens), c

    def _head_back(self, c: Cache, targets: Array, ready: Ready) -> Array:
        d, E = self.d, self.E
        # the mean over the global batch's tokens, times FP16's loss scale (1 otherwise)
        scale = self.loss_scale / (self.global_batch * self.cfg.seq_len)
        dlogits = E.kernel("head.ce.bwd", ce_cost(d.rows, d.vocab, E.e, E.kernels.mode,
                                                     backward=True), ce_back,
                           c["logits"], c.get("lse"), targets, self.vocab_lo, scale)
        dx, dw = E.column_parallel_back("head", dlogits, self.P[self.head], c["x"], d.rows,
                                        d.hidden, d.vocab)
        acc(self.G, self.head, None if dw is None else np.ascontiguousarray(dw.T))  # [V/tp, H]
        if self.cfg.tied_embeddings:        # the table's gradient is not complete yet
            self.hooks.grad_accumulated("wte")
        else:
            ready(["lm_head"])
        if self.cfg.norm == "pre":
            dx = norm_backward(E, self.cfg, "lnf", "lnf", dx, c["lnf"], self.P, self.G,
                               d.shard_rows, ready)
        return dx

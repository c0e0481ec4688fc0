"""One rank's executor: the real numpy math when numerics are on, the same charge always.

Ops on the critical path follow one data-ready cursor `t`: an op starts at max(t, its stream
free) and moves `t` to its end. The TP GEMM + collective pairs go through `mpiemu.overlap.api`
(the strategy switch: sequential, T3, ...); other TP collectives call the rings directly.
With numerics off every array is None and only the schedule runs (timing-only mode).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import numpy as np

from ..comm.p2p import TimedComm
from ..comm.collectives import all_gather, all_reduce, reduce_scatter
from ..devices.gemm import NO_EPILOGUE, Epilogue
from ..devices.kernels import check_mode
from ..devices.specs import dtype_bytes
from ..overlap.api import GemmShape, gather_then_gemm, gemm_then_reduce
from ..overlap.strategy import Overlap
from ..sim import charge as sim_ops
from ..sim.timeline import Span, Timeline
from ..training.grad_buffer import GradBuffer
from ..model.ops import Cost

Array = np.ndarray | None
Ready = Callable[[list[str]], None]     # "these gradients are final" (DP buckets)


def no_ready(names: list[str]) -> None:
    """Forward passes hand over no gradients."""


@dataclass(frozen=True)
class KernelOptions:
    """How a GPU rank launches its non-GEMM work (`train.kernels`: "unfused" as plain
    PyTorch, "fused" as Megatron-LM) and whether FC-1's bias + GeLU (and their gradients) run
    in the neighbouring GEMMs' cuBLASLt epilogues (`train.fuse_epilogues`)."""

    mode: str = "fused"
    fuse_epilogues: bool = False

    def __post_init__(self) -> None:
        check_mode(self.mode)


class Dims(NamedTuple):
    """Local sizes of one rank: rows are sequence x micro-batch, sequence first."""

    seq: int
    batch: int                 # sequences of this DP rank
    hidden: int
    heads: int                 # heads of this TP rank
    head_dim: int
    ffn: int                   # FC width of this TP rank
    vocab: int                 # vocabulary rows of this TP rank
    tp: int
    sp: bool

    @property
    def rows(self) -> int:
        return self.seq * self.batch

    @property
    def shard_rows(self) -> int:
        """Rows of the residual stream this rank holds (its sequence slice under SP)."""
        return self.rows // self.tp if self.sp else self.rows

    @property
    def attn_width(self) -> int:
        return self.heads * self.head_dim


class Engine:
    """Math plus emulated charge for every op of one rank, on one critical-path cursor."""

    def __init__(self, tl: Timeline, tp: TimedComm, *, dtype: str,
                 numerics: bool, overlap: Overlap, sp: bool,
                 kernels: KernelOptions = KernelOptions(), tp_async: bool = True) -> None:
        # one device model for every op: the TP communicator's, which also charges the
        # GEMMs paired with its rings (overlap.api)
        self.tl, self.model, self.tp = tl, tp.model, tp
        self.tp_async = tp_async
        self.kernels = kernels
        self.dtype, self.e = dtype, dtype_bytes(dtype)
        self.on, self.overlap, self.sp = numerics, overlap, sp
        self.t = 0.0
        self.charging = True          # False: math and payload only (time charged elsewhere)
        self.grad_buffer: GradBuffer | None = None     # Megatron's main_grad (train.build)
        self._payload_tp: TimedComm | None = None

    @contextmanager
    def payload_only(self) -> Iterator[None]:
        """Run the math and move the payload without charging emulated time.

        For ranks whose layers are charged as a whole schedule (Sunway, SwFormer): the TP
        collectives move the real values on a duplicate communicator with a scratch clock,
        so their messages never mix with the timed ones (SimGrid: payload apart from cost).
        """
        if self._payload_tp is None:
            tp = self.tp
            self._payload_tp = tp.sibling(tp.comm.Dup(), tp.name, Timeline())
        saved = (self.tp, self.t, self.charging)
        self.tp, self.charging = self._payload_tp, False
        try:
            yield
        finally:
            self.tp, self.t, self.charging = saved

    def layer_pass(self, layer: Any, pass_: str, math: Callable[[Ready], Any], empty: Any,
                   ready: Ready | None = None) -> Any:
        """Run one pass of a layer, `math(ready)`: on a GPU its ops charge themselves as they
        run; the Sunway executor (`executors.sunway.SunwayEngine`) charges the pass whole."""
        return math(ready if ready is not None else no_ready)

    def kernel(self, name: str, cost: Cost | Sequence[Cost],
               fn: Callable[..., Any] | None = None, *args: Any) -> Any:
        """Memory-bound kernels: runs fn(*args) if numerics are on, charges each kernel of
        `cost` in order (`name.tag` when an op launches several; none: fused elsewhere)."""
        out = fn(*args) if self.on and fn is not None else None
        kernels = [cost] if isinstance(cost, Cost) else list(cost)
        for k in kernels if self.charging else []:
            label = f"{name}.{k.tag}" if k.tag and len(kernels) > 1 else name
            self.t = sim_ops.elementwise(self.tl, self.model, label, k.read_bytes,
                                         k.write_bytes, k.flops, after=self.t,
                                         sfu_ops=k.sfu_ops, bw_util=k.bw_util).t_end
        return out

    def gemm(self, name: str, a: Array, b: Array, m: int, n: int, k: int,
             epilogue: Epilogue = NO_EPILOGUE) -> Array:
        """C[M, N] = A[M, K] B[K, N] on this rank alone (no collective)."""
        out = a @ b if self.on and a is not None and b is not None else None
        if self.charging:
            self.t = sim_ops.gemm(self.tl, self.model, name, m, n, k, dtype=self.dtype,
                                  after=self.t, epilogue=epilogue).t_end
        return out

    def wgrad(self, name: str, x_t: Array, dy: Array, m: int, n: int, k: int) -> Array:
        """A weight gradient W'[M, N] = x^T[M, K] dy[K, N]: into Megatron's gradient buffer
        by its own epilogue when accumulation is fused (`grad_buffer`), else written."""
        epi = NO_EPILOGUE if self.grad_buffer is None else self.grad_buffer.wgrad_epilogue(m, n)
        return self.gemm(name, x_t, dy, m, n, k, epi)

    def row_parallel(self, name: str, x: Array, w: Array, m: int, n: int, k: int) -> Array:
        """x[M, K/tp] w[K/tp, N] summed over TP: all-reduce, or reduce-scatter of rows (SP).

        forward: GEMM -> all-reduce / reduce-scatter; conjugate: `column_parallel`.
        """
        if self.tp.size == 1:
            return self.gemm(f"{name}.gemm", x, w, m, n, k)
        y, span = gemm_then_reduce(self.tp, x, w, shape=GemmShape(m, n, k),
                                   mode="reduce_scatter" if self.sp else "all_reduce",
                                   dtype=self.dtype, after=self.t, overlap=self.overlap,
                                   name=name)
        self.t = span.t_end
        return y

    def column_parallel(self, name: str, x_s: Array, w: Array, m: int, n: int, k: int,
                        epilogue: Epilogue = NO_EPILOGUE) -> tuple[Array, Array]:
        """(x w[K, N/tp], x): under SP x is first all-gathered from its sequence shards.

        forward: all-gather -> GEMM (SP) or identity -> GEMM; conjugate: `row_parallel`.
        Returns the gathered x too: the weight gradient needs it. A fused `epilogue` needs
        the plain GEMM (no SP; the training config refuses the combination).
        """
        if self.tp.size == 1 or not self.sp:
            return self.gemm(f"{name}.gemm", x_s, w, m, n, k, epilogue), x_s
        full = None if x_s is None else np.empty((m, k), x_s.dtype)
        y, span = gather_then_gemm(self.tp, x_s, w, shape=GemmShape(m, n, k),
                                   dtype=self.dtype, after=self.t, overlap=self.overlap,
                                   name=name, gathered_out=full)
        self.t = span.t_end
        return y, full

    def column_parallel_back(self, name: str, dy: Array, w_t: Array, x_saved: Array,
                             m: int, n: int, k: int) -> tuple[Array, Array]:
        """(dx, dW) of y = x W[K, N/tp]: dx = dy W^T summed over TP, dW = x^T dy.

        Conjugate of `column_parallel`. Megatron-LM's LinearWithGradAccumulationAndAsync-
        Communication: under SP the saved sequence shard of x is all-gathered again (start,
        then the dgrad GEMM runs meanwhile); the dgrad's all-reduce (reduce-scatter under SP)
        is issued asynchronously and the wgrad GEMM runs while it moves; then both are
        waited for (`tp_async`; off: wgrad, then dgrad and its reduction in sequence, as
        the thesis's serialized layer). A T3-style strategy fuses the dgrad GEMM with its
        reduction instead.
        m: rows, n: the input width K, k: this rank's N/tp (the dgrad GEMM's shape); events
        are `name.bwd.*` (dgrad and its reduction) and `name.wgrad`.
        """
        bwd = f"{name}.bwd"
        x_full, t_gather = x_saved, self.t
        if self.sp and self.tp.size > 1:       # re-gather the input in backward (Megatron SP)
            x_full, span = self._start_gather(f"{bwd}.regather", x_saved, m, n)
            t_gather = span.t_end
        x_t = None if x_full is None else x_full.T
        if self.tp.size == 1 or not self.tp_async or self.overlap.strategy != "sequential":
            self.t = max(self.t, t_gather)      # in order: wgrad, then dgrad and its reduction
            dw = self.wgrad(f"{name}.wgrad", x_t, dy, n, k, m)
            return self.row_parallel(bwd, dy, w_t, m, n, k), dw
        dx = self.gemm(f"{bwd}.gemm", dy, w_t, m, n, k)
        dx, span = self._start_reduce(bwd, dx, m, n)
        # the reduction was issued asynchronously: the wgrad GEMM runs while it moves
        self.t = max(self.t, t_gather)
        dw = self.wgrad(f"{name}.wgrad", x_t, dy, n, k, m)
        self.t = max(self.t, span.t_end)
        return dx, dw

    # -- TP collectives that are not GEMM pairs (embedding, cross-entropy, SP grads) ---------
    def tp_reduce(self, name: str, x: Array, rows: int, width: int) -> Array:
        """Sum a [rows, width] partial over TP: all-reduce, or reduce-scatter of rows (SP)."""
        if self.tp.size == 1:
            return x
        y, span = self._start_reduce(name, x, rows, width)
        self.t = span.t_end
        return y

    def tp_gather_rows(self, name: str, x_s: Array, rows: int, width: int,
                       itemsize: int | None = None) -> Array:
        """All-gather [rows/tp, width] shards into [rows, width] (rank order)."""
        if self.tp.size == 1:
            return x_s
        y, span = self._start_gather(name, x_s, rows, width, itemsize)
        self.t = span.t_end
        return y

    def _start_reduce(self, name: str, x: Array, rows: int, width: int) -> tuple[Array, Span]:
        """`tp_reduce` issued from the cursor on the links; nothing waits for it here."""
        coll, tag = (reduce_scatter, "rs") if self.sp else (all_reduce, "ar")
        return coll(self.tp, x, after=self.t, count=rows * width, wire_itemsize=self.e,
                    bidirectional=self.overlap.bidirectional, label=f"{name}.{tag}",
                    unit=width)

    def _start_gather(self, name: str, x_s: Array, rows: int, width: int,
                      itemsize: int | None = None) -> tuple[Array, Span]:
        """`tp_gather_rows` issued from the cursor on the links; nothing waits for it here."""
        return all_gather(self.tp, x_s, total=rows * width, after=self.t,
                          count=rows // self.tp.size * width, wire_itemsize=itemsize or self.e,
                          bidirectional=self.overlap.bidirectional, label=f"{name}.ag",
                          unit=width)

    def tp_sum(self, name: str, x: Array, count: int, itemsize: int) -> Array:
        """All-reduce a flat vector over TP (norms, SP-replicated gradients)."""
        if self.tp.size == 1:
            return x
        y, span = all_reduce(self.tp, x, after=self.t, count=count, wire_itemsize=itemsize,
                             bidirectional=self.overlap.bidirectional, label=f"{name}.ar")
        self.t = span.t_end
        return y

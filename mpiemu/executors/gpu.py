"""The GPU executor: each op the layers call runs its math (numerics on) and is charged as it
comes, by the device's cost, on one critical-path cursor (`model.executor`).

An op starts at max(cursor, its stream free) and moves the cursor to its end; only this
class (and the Sunway executor built on it) moves it. The TP GEMM + collective pairs go
through `overlap.api` (the strategy switch: sequential, T3, ...); other TP collectives call
the rings directly, with the device's reduction cost. With numerics off every array is None
and only the schedule runs (timing-only mode).
"""
from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Callable, Sequence

import numpy as np

from ..comm.all_to_all import all_to_all_v
from ..comm.collectives import all_gather, all_reduce, all_reduce_scalars, reduce_scatter
from ..comm.p2p import RecvHandle, SendHandle, TimedComm
from ..devices import attention_gpu as ag
from ..devices.attention_gpu import AttnShape
from ..devices.gemm import NO_EPILOGUE, Epilogue
from ..devices.specs import dtype_bytes
from ..model.executor import Array, Cost, Executor, PassState, Ready, no_ready
from ..model.steps import Steps
from ..precision.cast_costs import cast_kernels
from ..overlap.api import GemmShape, gather_then_gemm, gemm_then_reduce
from ..sim import charge
from ..sim.timeline import COMPUTE, SimTime, Span
from .gemm_roles import OPERANDS, role as _role, tensor_key as _tensor_key
from .registry import ExecutorSetup


class GpuExecutor:
    """Math plus emulated charge for every op of one rank, on one critical-path cursor."""

    def __init__(self, setup: ExecutorSetup) -> None:
        self.tl, self.cost, self.tp, self.cp = setup.tl, setup.cost, setup.tp, setup.cp
        self.ep, self.etp = setup.ep, setup.etp
        self.etp_ep = setup.ep if setup.etp_ep is None else setup.etp_ep
        self.tp_async, self.kernels = setup.tp_async, setup.kernels
        self.dtype, self.e = setup.dtype, dtype_bytes(setup.dtype)
        self.on, self.overlap, self.sp = setup.numerics, setup.overlap, setup.dims.sp
        self.mm = setup.precision           # every GEMM's math (`precision.matmul`)
        self.fp8 = setup.fp8                # [fp8] recipe of the layers' linear GEMMs
        self.fp8_gemm = setup.fp8_gemm      # their math under it (numerics on)
        self.fp8_params = setup.fp8_params
        self._weights_cast: dict[str, int] = {}     # layer GEMM -> iteration of its cast
        self._in_layer = False              # inside a transformer layer's pass
        # Megatron's gradient buffer: a weight-gradient GEMM's epilogue adds into it
        self.wgrad_epilogue = setup.wgrad_epilogue
        self._t: SimTime = 0.0
        self._charging = True         # False: math and payload only (a Sunway pass's math)

    @property
    def t(self) -> SimTime:
        """The critical-path cursor."""
        return self._t

    def labelled(self, **labels: int | str) -> AbstractContextManager[None]:
        return self.tl.labelled(**labels)

    def wait_until(self, t: SimTime) -> None:
        self._t = max(self._t, t)

    def layer_steps(self, tag: str, params: str, pass_: str,
                    math: Callable[[Ready], Steps[Any]], empty: Any,
                    ready: Ready | None = None) -> Steps[Any]:
        """On a GPU a pass's ops charge themselves as they run (a transformer layer's
        linear GEMMs in FP8 under an [fp8] recipe; the output layer stays bf16)."""
        self._in_layer = True
        try:
            return (yield from math(ready if ready is not None else no_ready))
        finally:
            self._in_layer = False
            if self.on and self.fp8_gemm is not None:    # the recipe's amax update
                self.fp8_gemm.end_pass(backward=pass_ == "bwd")

    def pass_state(self) -> PassState:
        return PassState(self._t, self.tl.labels, self._in_layer)

    def resume(self, state: PassState) -> None:
        self._t, self.tl.labels, self._in_layer = state

    def _fp8_here(self) -> bool:
        """A layer's linear GEMMs run in FP8 here (an [fp8] recipe, inside a layer pass)."""
        return self.fp8 != "off" and self._in_layer

    def _gemm_dtype(self, name: str, role: str, m: int, n: int, k: int,
                    groups: int = 1) -> str:
        """The dtype a GEMM is charged in; under an FP8 recipe inside a layer, FP8, after
        the recipe's casts of its operands (`precision.cast_costs`: a weight once a step)."""
        if not self._fp8_here() or ".router." in name:
            return self.dtype             # the MoE router: a plain bf16 linear (Megatron-Core)
        key, it = _tensor_key(name), self.tl.labels.iteration
        weight = role == "fprop" and not self.fp8_params and self._weights_cast.get(key) != it
        if weight:
            self._weights_cast[key] = it
        for cast in cast_kernels(self.fp8, role, m, n, k, weight, groups) \
                if self._charging else []:
            self.kernel(f"{name}.{cast.tag}", cast)
        return "fp8"

    # -- compute -----------------------------------------------------------------------------
    def kernel(self, name: str, cost: Cost | Sequence[Cost],
               fn: Callable[..., Any] | None = None, *args: Any) -> Any:
        """Memory-bound kernels: runs fn(*args) if numerics are on, charges each kernel of
        `cost` in order (`name.tag` when an op launches several; none: fused elsewhere)."""
        out = fn(*args) if self.on and fn is not None else None
        kernels = [cost] if isinstance(cost, Cost) else list(cost)
        for k in kernels if self._charging else []:
            label = f"{name}.{k.tag}" if k.tag and len(kernels) > 1 else name
            self._t = charge.elementwise(self.tl, self.cost, label, k.read_bytes,
                                         k.write_bytes, k.flops, after=self._t,
                                         sfu_ops=k.sfu_ops, bw_util=k.bw_util).t_end
        return out

    def gemm(self, name: str, a: Array, b: Array, m: int, n: int, k: int,
             epilogue: Epilogue = NO_EPILOGUE, fp32_out: bool = False) -> Array:
        """C[M, N] = A[M, K] B[K, N] on this rank alone (no collective); `fp32_out`: the
        accumulator itself (a weight gradient into the fp32 `main_grad`)."""
        out, role = None, "wgrad" if fp32_out else _role(name)
        if self.on and a is not None and b is not None:
            out = self._math(name, role, a, b)
        dtype = self._gemm_dtype(name, role, m, n, k)
        if self._charging:
            self._t = charge.gemm(self.tl, self.cost, name, m, n, k, dtype=dtype,
                                  after=self._t, epilogue=epilogue).t_end
        return out

    def grouped_gemm(self, name: str, a: list[Array] | None, b: list[Array] | None,
                     shapes: list[tuple[int, int, int]]) -> list[Array] | None:
        """C_g = A_g B_g for each group g of shape (m, n, k), one kernel (Transformer
        Engine's GroupedLinear over a rank's experts). Charged as one batched GEMM over the
        groups with work, of their mean size per dimension rounded up (ASSUMPTION: the
        grouped kernel's tiles cost as a batch of equal GEMMs of the same total work)."""
        out: list[Array] | None = None
        if self.on and a is not None and b is not None:
            out = [None if x is None or y is None else self.mm(name, x, y)
                   for x, y in zip(a, b)]
        busy = [s for s in shapes if min(s) > 0]
        if self._charging and busy:
            m, n, k = (-(-sum(s[i] for s in busy) // len(busy)) for i in range(3))
            dtype = self._gemm_dtype(name, _role(name), m * len(busy), n, k, len(busy))
            self._t = charge.gemm(self.tl, self.cost, name, m, n, k, dtype=dtype,
                                  after=self._t, batch=len(busy)).t_end
        return out

    def wgrad(self, name: str, x_t: Array, dy: Array, m: int, n: int, k: int) -> Array:
        """A weight gradient W'[M, N] = x^T[M, K] dy[K, N]: into Megatron's gradient buffer
        by its own epilogue when accumulation is fused (`wgrad_epilogue`), else written."""
        epi = NO_EPILOGUE if self.wgrad_epilogue is None else self.wgrad_epilogue(m, n)
        return self.gemm(name, x_t, dy, m, n, k, epi, fp32_out=True)

    def round(self, x: Array) -> Array:
        return None if x is None else self.mm.round(x)

    def attention(self, name: str, shape: AttnShape, variant: str, backward: bool) -> None:
        """The variant's kernels for one pass (`devices.attention_gpu`), in order."""
        if not self._charging:
            return
        t = self._t
        for step in ag.steps(self.cost, shape, variant, self.kernels.mode, self.dtype,
                             backward):
            label = f"{name}.{step.name}"
            if isinstance(step, ag.GemmStep):
                t = charge.gemm(self.tl, self.cost, label, step.m, step.n, step.k,
                                dtype=self.dtype, after=t, batch=step.batch,
                                epilogue=step.epilogue).t_end
            elif isinstance(step, ag.KernelStep):
                k = step.kernel
                t = charge.elementwise(self.tl, self.cost, label, k.read_bytes, k.write_bytes,
                                       k.flops, after=t, sfu_ops=k.sfu_ops,
                                       bw_util=k.bw_util).t_end
            else:
                f = ag.flash_cost(self.cost.spec, step.shape, self.dtype, step.backward)
                t = self.tl.reserve(label, [COMPUTE], f.time_s, t, cat="compute",
                                    flops=f.flops, dram_bytes=f.dram_bytes).t_end
        self._t = t

    def occupy(self, name: str, seconds: SimTime, *, flops: float = 0.0,
               dram_bytes: float = 0.0) -> None:
        self._t = self.tl.reserve(name, [COMPUTE], seconds, self._t, flops=flops,
                                  dram_bytes=dram_bytes).t_end

    def _math(self, name: str, role: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """A GEMM's values in the numerics' precision: a layer's linear GEMMs in FP8 under
        an [fp8] recipe; a weight gradient is the fp32 accumulator."""
        mm = self.fp8_gemm if self.fp8_gemm is not None and self._in_layer else self.mm
        fn = mm.accumulate if role == "wgrad" else mm
        return fn(_tensor_key(name), a, b, OPERANDS[role])

    def _matmul(self, name: str) -> Callable[[Any, Any], Any]:
        """The GEMM inside a TP pair, in the numerics' precision."""
        return lambda a, b: self._math(name, _role(name), a, b)

    # -- tensor parallelism ------------------------------------------------------------------
    def row_parallel(self, name: str, x: Array, w: Array, m: int, n: int, k: int) -> Array:
        """x[M, K/tp] w[K/tp, N] summed over TP: all-reduce, or reduce-scatter of rows (SP).

        forward: GEMM -> all-reduce / reduce-scatter; conjugate: `column_parallel`.
        """
        if self.tp.size == 1:
            return self.gemm(f"{name}.gemm", x, w, m, n, k)
        gemm_dtype = self._gemm_dtype(name, _role(name), m, n, k)
        y, span = gemm_then_reduce(self.tp, x, w, cost=self.cost, shape=GemmShape(m, n, k),
                                   mode="reduce_scatter" if self.sp else "all_reduce",
                                   dtype=self.dtype, after=self._t, overlap=self.overlap,
                                   name=name, matmul=self._matmul(name),
                                   gemm_dtype=gemm_dtype)
        self._t = span.t_end
        return self.round(y)        # each rank's rounded partial, summed, rounded again

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
        # under an FP8 recipe TE casts the rank's shard and all-gathers it quantized: one
        # byte a value (modern_training.md 7.4; a row-parallel layer's dy in its backward too)
        gemm_dtype = self._gemm_dtype(name, _role(name), m // self.tp.size, n, k)
        y, span = gather_then_gemm(self.tp, x_s, w, cost=self.cost, shape=GemmShape(m, n, k),
                                   dtype="fp8" if gemm_dtype == "fp8" else self.dtype,
                                   after=self._t, overlap=self.overlap,
                                   name=name, gathered_out=full, matmul=self._matmul(name),
                                   gemm_dtype=gemm_dtype)
        self._t = span.t_end
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
        x_full, t_gather = x_saved, self._t
        if self.sp and self.tp.size > 1:       # re-gather the input in backward (Megatron SP)
            x_full, span = self._start_gather(f"{bwd}.regather", x_saved, m, n,
                                              1 if self._fp8_here() else None)   # FP8 copy
            t_gather = span.t_end
        x_t = None if x_full is None else x_full.T
        if self.tp.size == 1 or not self.tp_async or self.overlap.strategy != "sequential":
            self._t = max(self._t, t_gather)    # in order: wgrad, then dgrad and its reduction
            dw = self.wgrad(f"{name}.wgrad", x_t, dy, n, k, m)
            return self.row_parallel(bwd, dy, w_t, m, n, k), dw
        dx = self.gemm(f"{bwd}.gemm", dy, w_t, m, n, k)
        # start: the dgrad's reduction, asynchronously ...
        dx, span = self._start_reduce(bwd, dx, m, n)
        dx = self.round(dx)
        # ... independent work: the wgrad GEMM runs while it moves ...
        self._t = max(self._t, t_gather)
        dw = self.wgrad(f"{name}.wgrad", x_t, dy, n, k, m)
        # ... wait: both are needed before the layer below
        self._t = max(self._t, span.t_end)
        return dx, dw

    # -- TP collectives that are not GEMM pairs (embedding, cross-entropy, SP grads) ---------
    def tp_reduce(self, name: str, x: Array, rows: int, width: int) -> Array:
        """Sum a [rows, width] partial over TP: all-reduce, or reduce-scatter of rows (SP)."""
        if self.tp.size == 1:
            return x
        y, span = self._start_reduce(name, x, rows, width)
        self._t = span.t_end
        return y

    def tp_gather_rows(self, name: str, x_s: Array, rows: int, width: int,
                       itemsize: int | None = None) -> Array:
        """All-gather [rows/tp, width] shards into [rows, width] (rank order)."""
        if self.tp.size == 1:
            return x_s
        y, span = self._start_gather(name, x_s, rows, width, itemsize)
        self._t = span.t_end
        return y

    def _start_reduce(self, name: str, x: Array, rows: int, width: int) -> tuple[Array, Span]:
        """`tp_reduce` issued from the cursor on the links; nothing waits for it here."""
        coll, tag = (reduce_scatter, "rs") if self.sp else (all_reduce, "ar")
        return coll(self.tp, x, reduce_s=self.cost.reduction_s, after=self._t,
                    count=rows * width, wire_itemsize=self.e,
                    bidirectional=self.overlap.bidirectional, label=f"{name}.{tag}",
                    unit=width)

    def _start_gather(self, name: str, x_s: Array, rows: int, width: int,
                      itemsize: int | None = None) -> tuple[Array, Span]:
        """`tp_gather_rows` issued from the cursor on the links; nothing waits for it here."""
        return all_gather(self.tp, x_s, total=rows * width, after=self._t,
                          count=rows // self.tp.size * width, wire_itemsize=itemsize or self.e,
                          bidirectional=self.overlap.bidirectional, label=f"{name}.ag",
                          unit=width)

    def tp_sum(self, name: str, x: Array, count: int, itemsize: int) -> Array:
        """All-reduce a flat vector over TP (norms, SP-replicated gradients)."""
        if self.tp.size == 1:
            return x
        y, span = all_reduce(self.tp, x, reduce_s=self.cost.reduction_s, after=self._t,
                             count=count, wire_itemsize=itemsize,
                             bidirectional=self.overlap.bidirectional, label=f"{name}.ar")
        self._t = span.t_end
        return y

    def tp_gather_cols(self, name: str, x: Array, rows: int, width: int) -> Array:
        """All-gather [rows, width] blocks into [rows, tp x width] (Megatron-Core's gather
        of the QKV output when TP exceeds the KV heads); one ring all-gather of the
        blocks, each rank's block whole."""
        tp = self.tp.size
        if tp == 1:
            return x
        flat = None if x is None else np.ascontiguousarray(x).reshape(-1)
        y, span = all_gather(self.tp, flat, total=tp * rows * width, after=self._t,
                             count=rows * width, wire_itemsize=self.e,
                             bidirectional=self.overlap.bidirectional, label=f"{name}.ag",
                             unit=rows * width)
        self._t = span.t_end
        if y is None:
            return None
        return y.reshape(tp, rows, width).transpose(1, 0, 2).reshape(rows, tp * width)

    def tp_scatter_cols(self, name: str, x: Array, rows: int, width: int) -> Array:
        """Conjugate of `tp_gather_cols`: one ring reduce-scatter of the [tp, rows, width]
        blocks; this rank keeps the sum of its block."""
        tp = self.tp.size
        if tp == 1:
            return x
        flat = None if x is None else np.ascontiguousarray(
            x.reshape(rows, tp, width).transpose(1, 0, 2)).reshape(-1)   # (tp, rows, width)
        y, span = reduce_scatter(self.tp, flat, reduce_s=self.cost.reduction_s, after=self._t,
                                 count=tp * rows * width, wire_itemsize=self.e,
                                 bidirectional=self.overlap.bidirectional,
                                 label=f"{name}.rs", unit=rows * width)
        self._t = span.t_end
        return None if y is None else y.reshape(rows, width)

    # -- other groups, from the cursor -------------------------------------------------------
    def all_reduce(self, group: TimedComm, name: str, x: Array, count: int,
                   itemsize: int) -> Array:
        return self._at_cursor(all_reduce, group, name, x, count, itemsize)

    def all_reduce_scalars(self, group: TimedComm, name: str, x: Array, count: int,
                           itemsize: int) -> Array:
        return self._at_cursor(all_reduce_scalars, group, name, x, count, itemsize)

    def all_gather(self, group: TimedComm, name: str, x: Array, count: int,
                   itemsize: int) -> Array:
        y, span = all_gather(group, x, total=group.size * count, after=self._t, count=count,
                             wire_itemsize=itemsize, label=name, unit=count)
        self._t = span.t_end
        return y

    def reduce_scatter(self, group: TimedComm, name: str, x: Array, count: int,
                       itemsize: int) -> Array:
        return self._at_cursor(reduce_scatter, group, name, x, count, itemsize,
                               unit=count // group.size)

    def all_to_all(self, group: TimedComm, name: str, chunks: list[np.ndarray] | None,
                   send_rows: list[int], recv_rows: list[int], width: int,
                   itemsize: int) -> list[np.ndarray] | None:
        """Rows of `width` elements to every member (`send_rows[j]` to member j), theirs
        received in member order: NCCL's all-to-all-v, issued at the cursor and waited for."""
        got, t_end = self.all_to_all_start(group, name, chunks, send_rows, recv_rows, width,
                                           itemsize)
        self._t = t_end
        return got

    def all_to_all_start(self, group: TimedComm, name: str, chunks: list[np.ndarray] | None,
                         send_rows: list[int], recv_rows: list[int], width: int,
                         itemsize: int) -> tuple[list[np.ndarray] | None, SimTime]:
        """`all_to_all` issued at the cursor, the cursor left where it is: (what arrived,
        when the call ends); the caller runs independent work, then `wait_until` the end."""
        got, span = all_to_all_v(group, chunks, send_rows, recv_rows, itemsize=itemsize,
                                 after=self._t, label=name, unit=width)
        return (None if chunks is None else got), span.t_end     # type: ignore[return-value]

    def send(self, group: TimedComm, name: str, buf: Array, dest: int, tag: int,
             nbytes: float) -> SendHandle:
        return group.isend(buf, dest, tag, nbytes, self._t, label=name)

    def recv(self, group: TimedComm, buf: Array, source: int, tag: int) -> RecvHandle:
        return group.irecv(buf, source, tag, self._t)

    def wait_recv(self, handle: RecvHandle) -> None:
        self._t = max(self._t, handle.wait())

    def _at_cursor(self, coll: Callable[..., tuple[Array, Span]], group: TimedComm, name: str,
                   x: Array, count: int, itemsize: int, **kw: int) -> Array:
        """A collective on another group, issued at the cursor and waited for."""
        y, span = coll(group, x, reduce_s=self.cost.reduction_s, after=self._t, count=count,
                       wire_itemsize=itemsize, label=name, **kw)
        self._t = span.t_end
        return y

def _keeps_the_protocol(ex: GpuExecutor) -> Executor:
    """Never called: mypy checks here that the class implements `model.executor.Executor`."""
    return ex

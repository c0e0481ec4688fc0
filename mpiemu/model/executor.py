"""What the transformer asks of whoever runs it on a device: the executor protocol.

The layers (`layers`, `stage`) and the training step (`training/`) call these ops in order,
with the real arrays when numerics are on (None otherwise) and the sizes that say what each
op is. An executor (`executors/`, one per device kind) runs the math when asked and charges
the op on the device its rank plays, on one critical-path cursor `t` that only it moves: an
op starts at max(t, its stream free) and moves t to its end. Payload apart from cost: the
numbers an op computes never depend on what it costs.

Shapes: `gemm(m, n, k)` is C[M, N] = A[M, K] B[K, N]; activations are [rows, width], rows
sequence x micro-batch, sequence first (Megatron). TP pairs (`row_parallel`,
`column_parallel` and its backward) are Megatron's linear layers (thesis 4.5.1; under SP,
Korthikanti et al. 2022).
"""
from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Protocol, Sequence

import numpy as np

from ..devices.attention_gpu import AttnShape
from ..devices.cost import DeviceCost
from ..devices.gemm import NO_EPILOGUE, Epilogue
from ..devices.kernels import Kernel as Cost
from ..devices.kernels import check_mode
from ..sim.timeline import SimTime
from .steps import Steps

if TYPE_CHECKING:                  # the protocol names the group type; MPI loads with an executor
    from ..comm.p2p import RecvHandle, SendHandle, TimedComm

Array = np.ndarray | None
Ready = Callable[[list[str]], None]     # "these gradients are final" (DP buckets)


def no_ready(names: list[str]) -> None:
    """Forward passes hand over no gradients."""


class PassState(NamedTuple):
    """A pass's own part of an executor, set aside while another pass runs (`resume`)."""

    t: SimTime                     # its cursor
    labels: Any                    # its trace labels (layer, phase)
    in_layer: bool = False         # inside a transformer layer's pass (FP8 GEMMs)


@dataclass(frozen=True)
class KernelOptions:
    """How a rank launches its non-GEMM work (`train.kernels`: "unfused" as plain PyTorch,
    "fused" as Megatron-LM) and whether FC-1's bias + GeLU (and their gradients) run in the
    neighbouring GEMMs' cuBLASLt epilogues (`train.fuse_epilogues`)."""

    mode: str = "fused"
    fuse_epilogues: bool = False

    def __post_init__(self) -> None:
        check_mode(self.mode)


class Executor(Protocol):
    """The ops a rank's transformer and training step run, charged on its device."""

    on: bool                       # numerics: real arrays (else every Array is None)
    dtype: str                     # the emulated dtype
    e: int                         # its bytes per element
    sp: bool                       # Megatron's sequence parallelism (TP > 1)
    kernels: KernelOptions
    cost: DeviceCost               # what the device's work costs
    tp: TimedComm                  # the TP group
    cp: TimedComm | None           # the context-parallel group, if any
    ep: TimedComm | None           # the expert-parallel group, if the model has experts
    etp: TimedComm | None          # the expert tensor-parallel group (parallel.etp > 1)
    etp_ep: TimedComm | None       # both together: expert TP x EP (the ep group at etp 1)

    @property
    def t(self) -> SimTime:
        """The critical-path cursor: when the data the next op needs is ready."""

    def labelled(self, **labels: int | str) -> AbstractContextManager[None]:
        """Trace labels (iteration, layer, phase) on every op placed inside."""

    # -- a layer's pass ----------------------------------------------------------------------
    def layer_steps(self, tag: str, params: str, pass_: str,
                    math: Callable[[Ready], Steps[Any]], empty: Any,
                    ready: Ready | None = None) -> Steps[Any]:
        """One pass ("fwd" / "bwd") of layer `tag` (parameters named `params`...) as steps:
        `math` charges its ops as they run, or the executor charges the pass whole."""

    def pass_state(self) -> PassState:
        """What belongs to the pass running (its cursor, its trace labels), to set aside
        while another micro-batch's pass runs (`resume`)."""

    def resume(self, state: PassState) -> None:
        """Continue the pass whose state this is."""

    # -- compute -----------------------------------------------------------------------------
    def kernel(self, name: str, cost: Cost | Sequence[Cost],
               fn: Callable[..., Any] | None = None, *args: Any) -> Any:
        """Memory-bound kernels: fn(*args) when numerics are on; each kernel charged."""

    def gemm(self, name: str, a: Array, b: Array, m: int, n: int, k: int,
             epilogue: Epilogue = NO_EPILOGUE) -> Array:
        """C[M, N] = A[M, K] B[K, N] on this rank alone."""

    def round(self, x: Array) -> Array:
        """x as a tensor of the numerics' precision (`run.numeric_dtype`): the attention
        core's outputs, which run as one fused kernel with fp32 inside."""

    def grouped_gemm(self, name: str, a: list[Array] | None, b: list[Array] | None,
                     shapes: list[tuple[int, int, int]]) -> list[Array] | None:
        """C_g = A_g B_g for groups of their own (m, n, k): one grouped GEMM (experts)."""

    def wgrad(self, name: str, x_t: Array, dy: Array, m: int, n: int, k: int) -> Array:
        """A weight gradient W'[M, N] = x^T[M, K] dy[K, N]."""

    def attention(self, name: str, shape: AttnShape, variant: str, backward: bool) -> None:
        """Charge the attention core's kernels of one pass (its math runs in the layer)."""

    def occupy(self, name: str, seconds: SimTime, *, flops: float = 0.0,
               dram_bytes: float = 0.0) -> None:
        """Work whose time is known (near-memory compute): the compute stream for `seconds`."""

    # -- tensor parallelism ------------------------------------------------------------------
    def row_parallel(self, name: str, x: Array, w: Array, m: int, n: int, k: int) -> Array:
        """x[M, K/tp] w[K/tp, N] summed over TP (all-reduce, or reduce-scatter under SP)."""

    def column_parallel(self, name: str, x_s: Array, w: Array, m: int, n: int, k: int,
                        epilogue: Epilogue = NO_EPILOGUE) -> tuple[Array, Array]:
        """(x w[K, N/tp], x): under SP x is first all-gathered from its sequence shards."""

    def column_parallel_back(self, name: str, dy: Array, w_t: Array, x_saved: Array,
                             m: int, n: int, k: int) -> tuple[Array, Array]:
        """(dx, dW) of `column_parallel`: dx summed over TP, dW = x^T dy."""

    def tp_reduce(self, name: str, x: Array, rows: int, width: int) -> Array:
        """Sum a [rows, width] partial over TP (all-reduce, or reduce-scatter under SP)."""

    def tp_gather_rows(self, name: str, x_s: Array, rows: int, width: int,
                       itemsize: int | None = None) -> Array:
        """All-gather [rows/tp, width] shards into [rows, width] (rank order)."""

    def tp_sum(self, name: str, x: Array, count: int, itemsize: int) -> Array:
        """All-reduce a flat vector over TP (norms, SP-replicated gradients)."""

    def tp_gather_cols(self, name: str, x: Array, rows: int, width: int) -> Array:
        """All-gather [rows, width] blocks into [rows, tp x width], columns in rank order."""

    def tp_scatter_cols(self, name: str, x: Array, rows: int, width: int) -> Array:
        """Conjugate of `tp_gather_cols`: sum [rows, tp x width] over TP, keep this rank's
        [rows, width] columns (a reduce-scatter)."""

    # -- other groups, from the cursor -------------------------------------------------------
    def all_reduce(self, group: TimedComm, name: str, x: Array, count: int,
                   itemsize: int) -> Array:
        """Sum x over `group`, issued at the cursor and waited for."""

    def all_reduce_scalars(self, group: TimedComm, name: str, x: Array, count: int,
                           itemsize: int) -> Array:
        """Sum a few scalars over `group` (a norm), issued at the cursor and waited for."""

    def all_gather(self, group: TimedComm, name: str, x: Array, count: int,
                   itemsize: int) -> Array:
        """Every member's `count` elements, in rank order, issued at the cursor and waited
        for."""

    def reduce_scatter(self, group: TimedComm, name: str, x: Array, count: int,
                       itemsize: int) -> Array:
        """The sum of x over `group`, this member's 1/size of it, issued at the cursor and
        waited for."""

    def all_to_all(self, group: TimedComm, name: str, chunks: list[np.ndarray] | None,
                   send_rows: list[int], recv_rows: list[int], width: int,
                   itemsize: int) -> list[np.ndarray] | None:
        """Rows to and from every member of `group` (all-to-all-v), at the cursor, waited
        for; None when timing only."""

    def all_to_all_start(self, group: TimedComm, name: str, chunks: list[np.ndarray] | None,
                         send_rows: list[int], recv_rows: list[int], width: int,
                         itemsize: int) -> tuple[list[np.ndarray] | None, SimTime]:
        """The same, issued at the cursor but not waited for: (received, its end time)."""

    def send(self, group: TimedComm, name: str, buf: Array, dest: int, tag: int,
             nbytes: float) -> SendHandle:
        """A message whose data exists at the cursor; nothing waits for it here (`wait()`
        on the handle only frees its buffer)."""

    def recv(self, group: TimedComm, buf: Array, source: int, tag: int) -> RecvHandle:
        """A receive posted at the cursor, into `buf` (None: timing only)."""

    def wait_recv(self, handle: RecvHandle) -> None:
        """The cursor waits for the message's arrival."""

    def wait_until(self, t: SimTime) -> None:
        """The next op needs something that exists at emulated time t (a message, a
        parameter gather): the cursor moves to it if it is later."""

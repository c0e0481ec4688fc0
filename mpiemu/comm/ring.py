"""The ring: reduce-scatter and all-gather piece by piece, with hooks (thesis 2.4.3.1).

Rows of the data (a flat buffer viewed as [n / unit, unit], or the [M, N] output of a GEMM)
are cut into N chunks; each lane (`schedule.Lane`) is one ring with its order of ranks and its
share of every chunk; a piece (`schedule.Piece`) is one timed message of one lane at one step.
One lane is the plain ring; the bidirectional ring adds the reversed order on the high
halves; a ring whose ranks span nodes runs one lane per rail (`ring_orders`).

Reduce-scatter: at step 0 a rank sends its partial of chunk `lane.rs_chunk(rank, 0)`; at
step s >= 1 it adds the partial it receives to its own and forwards the sum, and at the last
step keeps it (its own chunk). All-gather: at step s it forwards the shard it received.
What differs between the plain collective and the fused GEMM + collective schedules
(`overlap/`) is a `RingHooks` object: when a piece's own data exists, how its send is timed
(the network's rate, or DRAM contention with a GEMM), what the last step's reduction costs;
the messages, the numerics and the order are this module's alone.

Every message goes through `TimedComm.place` (the network's one message path) and carries
its header on tag TAG + lane; its payload follows on DATA + lane in sub-pieces of at most
PIECE_BYTES, so a rank forwards the first part of a sum while it adds the next (pipelining,
as NCCL's slices). With numerics off only headers travel.
"""
from __future__ import annotations

from typing import Callable, Protocol, Sequence

import numpy as np
from mpi4py import MPI

from ..net import Network
from ..sim.timeline import SimTime
from .p2p import Call, RecvHandle, TimedComm, wait_all
from .lanes import Lane, Piece, chunk_bounds, lanes, plan

RS_TAG, RS_DATA, AG_TAG, AG_DATA = 100, 300, 200, 400
PIECE_BYTES = 1 << 20   # payload pipelining granularity (an emulator detail, not modelled)
# the device's time to reduce n elements of b bytes each (`DeviceCost.reduction_s`)
Reduction = Callable[[int, float], SimTime]


def ring_orders(tc: TimedComm, bidirectional: bool = False) -> list[tuple[int, ...]]:
    """Orders of the ring's lanes on this group (`orders_of`)."""
    return orders_of(tc.net, tc.devices, bidirectional)


def orders_of(net: Network, devices: Sequence[int], bidirectional: bool = False
              ) -> list[tuple[int, ...]]:
    """Orders of a ring's lanes over the group of these devices: rank order, or one rotated
    order per rail when the ranks sit on several nodes with more than one each (lane j
    leaves every node from its j-th member: rail-optimised, as NCCL's channels); the
    reversed orders too if bidirectional."""
    by_node: dict[int, list[int]] = {}
    for r, d in enumerate(devices):
        by_node.setdefault(net.node_of(d), []).append(r)
    groups = list(by_node.values())
    k = len(groups[0])
    if len(groups) > 1 and k > 1 and all(len(g) == k for g in groups):
        orders = [tuple(m for g in groups for m in g[j:] + g[:j]) for j in range(k)]
    else:
        orders = [tuple(range(len(devices)))]
    if bidirectional:
        orders += [tuple(reversed(o)) for o in orders]
    return orders


def ring_lanes(tc: TimedComm, m: int, bidirectional: bool = False) -> list[Lane]:
    """The lanes of a ring over m rows on this group (remembered per group: every layer
    asks for the same few)."""
    key = ("lanes", m, bidirectional)
    got = tc.memo.get(key)
    if got is None:
        got = tc.memo[key] = lanes(m, ring_orders(tc, bidirectional))
    return got


def ring_pieces(tc: TimedComm, m: int, bidirectional: bool, parts: int, kind: str
                ) -> list[Piece]:
    """This rank's pieces of `ring_lanes(tc, m, bidirectional)`, each lane chunk cut into
    `parts` (`schedule.plan`; remembered per group, read-only)."""
    key = ("pieces", kind, m, bidirectional, parts)
    got = tc.memo.get(key)
    if got is None:
        got = tc.memo[key] = plan(tc.rank, m, ring_lanes(tc, m, bidirectional), parts, kind)
    return got


def egress_ports(tc: TimedComm, ls: list[Lane]) -> int:
    """Distinct ports this rank's lanes leave through: the sends that run at once."""
    return len({tc.net.hop(tc.device, tc.devices[ln.peers(tc.rank)[0]]).egress for ln in ls})


class RingHooks(Protocol):
    """What a schedule plugs into the ring (`PlainHooks`: the collective alone)."""

    def ready(self, p: Piece) -> SimTime:
        """When this rank's own data of the piece exists."""

    def place(self, p: Piece, dst: int, ready: SimTime, nbytes: float) -> np.ndarray:
        """Time the piece's send to rank dst (through `TimedComm.place`); its header."""

    def received(self, p: Piece, nbytes: float) -> None:
        """A piece arrived (accounting)."""

    def finish(self, p: Piece, t: SimTime) -> SimTime:
        """Reduce-scatter's last step: the sum that stays here, ready from t; its end."""

    def local(self, p: Piece) -> np.ndarray | None:
        """Reduce-scatter: this rank's partial rows of the piece (numerics on)."""


class PlainReduce:
    """Reduce-scatter alone: data ready at t0; a forwarded sum streams out as it is added, so
    the port is busy for max(wire, reduction x the ports sending at once) (thesis 8.5.1.1:
    only the last step's reduction is exposed)."""

    def __init__(self, tc: TimedComm, call: Call, reduce_s: Reduction, ls: list[Lane],
                 width: int, itemsize: float, t0: SimTime, x: np.ndarray | None = None) -> None:
        self.tc, self.call, self.reduce_s = tc, call, reduce_s
        self.width, self.itemsize, self.t0, self.x = width, itemsize, t0, x
        self.ports = egress_ports(tc, ls)

    def ready(self, p: Piece) -> SimTime:
        return self.t0

    def _red(self, p: Piece) -> SimTime:
        return self.reduce_s(p.n_rows * self.width, self.itemsize)

    def place(self, p: Piece, dst: int, ready: SimTime, nbytes: float) -> np.ndarray:
        if p.step == 0:
            return self.tc.place(dst, nbytes, ready, self.call, label="rs.send", stage=0)
        feed = self._red(p) * self.ports
        return self.tc.place(dst, nbytes, ready, self.call, label="rs.send", stage=p.step,
                             feed=lambda _start: feed, dram_bytes=3 * nbytes)

    def received(self, p: Piece, nbytes: float) -> None:
        return None

    def finish(self, p: Piece, t: SimTime) -> SimTime:
        n = p.n_rows * self.width
        return self.tc.tl.reserve("rs.reduce", [self.tc.stream], self._red(p), t, cat="comm",
                                  flops=n, dram_bytes=3 * n * self.itemsize, stage=p.step
                                  ).t_end

    def local(self, p: Piece) -> np.ndarray | None:
        return None if self.x is None else self.x[p.rows[0]:p.rows[1]]


class PlainGather:
    """All-gather alone: each shard forwarded as it arrives, at the network's rate."""

    def __init__(self, tc: TimedComm, call: Call, t0: SimTime) -> None:
        self.tc, self.call, self.t0 = tc, call, t0

    def ready(self, p: Piece) -> SimTime:
        return self.t0

    def place(self, p: Piece, dst: int, ready: SimTime, nbytes: float) -> np.ndarray:
        return self.tc.place(dst, nbytes, ready, self.call, label="ag.send", stage=p.step)

    def received(self, p: Piece, nbytes: float) -> None:
        return None

    def finish(self, p: Piece, t: SimTime) -> SimTime:
        return t                          # an all-gather reduces nothing

    def local(self, p: Piece) -> np.ndarray | None:
        return None


def _add(x: np.ndarray, y: np.ndarray, out: np.ndarray) -> None:
    """out = x + y, on flat views when all three are contiguous (numpy adds [n, 1] rows
    about 1.8x slower than the same n elements flat)."""
    if x.flags.c_contiguous and y.flags.c_contiguous and out.flags.c_contiguous:
        np.add(x.reshape(-1), y.reshape(-1), out=out.reshape(-1))
    else:
        np.add(x, y, out=out)


def _subs(rows: tuple[int, int], row_bytes: int) -> list[tuple[int, int]]:
    """A piece's rows in sub-pieces of at most PIECE_BYTES (at least one row each)."""
    lo, hi = rows
    k = max(1, -(-(hi - lo) * row_bytes // PIECE_BYTES)) if hi > lo else 0
    return chunk_bounds(hi - lo, k, lo) if k else []


class _Ring:
    """What both directions share: lanes, pieces, hooks, send bookkeeping."""

    def __init__(self, tc: TimedComm, ls: list[Lane], pieces: list[Piece], width: int,
                 itemsize: float, hooks: RingHooks) -> None:
        self.tc, self.ls, self.pieces, self.width = tc, ls, pieces, width
        self.itemsize, self.hooks = itemsize, hooks
        self.sreqs: dict[tuple[int, int], list[MPI.Request]] = {}
        self.first_send = float("inf")
        self.dst = [ln.peers(tc.rank)[0] for ln in ls]       # by lane: where this rank sends
        self.src = [ln.peers(tc.rank)[1] for ln in ls]       # ... and receives from
        self.row_bytes = width * itemsize
        self.by_step: list[list[Piece]] = [[] for _ in range(ls[0].size)]
        for p in pieces:                    # execution order kept within a step
            self.by_step[p.step].append(p)

    def nbytes(self, p: Piece) -> float:
        return (p.rows[1] - p.rows[0]) * self.row_bytes

    def send(self, p: Piece, ready: SimTime, data: np.ndarray | None, tag: int, dtag: int,
             lo: int = 0) -> None:
        """Time the piece and post its header (and, with numerics, its payload rows)."""
        dst = self.dst[p.lane]
        header = self.hooks.place(p, dst, ready, self.nbytes(p))
        self.first_send = min(self.first_send, float(header[0]))
        reqs = self.tc.post(header, None, dst, tag + p.lane)
        if data is not None:
            reqs += [self.tc.comm.Isend(data[a - lo:b - lo], dst, dtag + p.lane)
                     for a, b in _subs(p.rows, data[0:1].nbytes or 1)]
        self.sreqs.setdefault((p.lane, p.step % 2), []).extend(reqs)

    def release(self, p: Piece) -> None:
        """The sends of two steps ago from this lane's buffers of this parity are done."""
        wait_all(self.sreqs.pop((p.lane, p.step % 2), []))

    def close(self) -> None:
        for reqs in self.sreqs.values():
            wait_all(reqs)
        self.sreqs.clear()


class ReduceScatter(_Ring):
    """One rank's pass over its reduce-scatter pieces; `out` gets its own chunk's rows
    (from `own_lo` on). `writable`: the hooks' local rows may take the sum in place (a GEMM's
    scratch output); otherwise work buffers hold it (the caller's input is left alone)."""

    def __init__(self, tc: TimedComm, ls: list[Lane], pieces: list[Piece], width: int,
                 itemsize: float, hooks: RingHooks, *, dtype: np.dtype | None = None,
                 out: np.ndarray | None = None, own_lo: int = 0,
                 writable: bool = False) -> None:
        super().__init__(tc, ls, pieces, width, itemsize, hooks)
        self.real, self.out, self.own_lo, self.writable = dtype is not None, out, own_lo, writable
        rows = max((hi - lo for ln in ls for lo, hi in ln.bounds), default=0) if self.real else 0

        def pool(name: str, r: int) -> list[list[np.ndarray]]:
            """Two buffers per lane (by step parity), kept by the communicator between calls."""
            dt = np.dtype(dtype if dtype is not None else np.float64)
            return [[tc.scratch(f"rs.{name}{i}.{j}", r * width, dt).reshape(r, width)
                     for j in (0, 1)] for i in range(len(ls))]
        self.rbuf = pool("recv", rows)
        self.work = pool("work", 0 if writable else rows)
        self.recvs: dict[tuple[int, int, int], tuple[RecvHandle, list[MPI.Request]]] = {}
        self.done = -float("inf")

    def run(self) -> "ReduceScatter":
        """All pieces in execution order; every request completed before returning."""
        size = self.tc.size
        for p in self.pieces:
            if p.lane == 0 and p.index == 0 and p.step + 1 < size:
                self._post(p.step + 1)
            if p.index == 0:
                self.release(p)          # buffers of this parity are free to overwrite
            local = self.hooks.local(p) if self.real else None
            if p.step == 0:
                self.send(p, self.hooks.ready(p), local, RS_TAG, RS_DATA, p.rows[0])
            else:
                self._combine(p, local)
        self.close()
        return self

    def _lane_lo(self, p: Piece) -> int:
        return self.ls[p.lane].bounds[p.chunk][0]

    def _post(self, step: int) -> None:
        """Post a step's receives early, so data can flow while this rank computes."""
        tc = self.tc
        for p in self.by_step[step]:
            src = self.src[p.lane]
            h = tc.irecv(None, src, RS_TAG + p.lane, 0.0, nbytes=self.nbytes(p))
            preqs = []
            if self.real:
                buf, lo = self.rbuf[p.lane][step % 2], self._lane_lo(p)
                preqs = [tc.comm.Irecv(buf[a - lo:b - lo], src, RS_DATA + p.lane)
                         for a, b in _subs(p.rows, self.width * buf.itemsize)]
            self.recvs[(p.lane, p.step, p.index)] = (h, preqs)

    def _combine(self, p: Piece, local: np.ndarray | None) -> None:
        """local + received: forwarded sub-piece by sub-piece, or kept at the last step."""
        h, preqs = self.recvs.pop((p.lane, p.step, p.index))
        wait_all(h.reqs)
        self.hooks.received(p, self.nbytes(p))
        t = max(self.hooks.ready(p), h.t_arrive)
        last = p.step == self.tc.size - 1
        target = None
        if self.real:
            assert local is not None
            lo = self._lane_lo(p)
            if last:
                assert self.out is not None
                target = self.out[p.rows[0] - self.own_lo:p.rows[1] - self.own_lo]
            elif self.writable:
                target = local
            else:
                target = self.work[p.lane][p.step % 2][p.rows[0] - lo:p.rows[1] - lo]
            recv = self.rbuf[p.lane][p.step % 2][p.rows[0] - lo:p.rows[1] - lo]
        if last:
            self.done = max(self.done, self.hooks.finish(p, t))
        dst = self.dst[p.lane]
        if not last:
            header = self.hooks.place(p, dst, t, self.nbytes(p))
            self.sreqs.setdefault((p.lane, p.step % 2), []).extend(
                self.tc.post(header, None, dst, RS_TAG + p.lane))
        if target is None:
            return
        base = p.rows[0]
        for req, (a, b) in zip(preqs, _subs(p.rows, target[0:1].nbytes or 1)):
            wait_all([req])
            _add(local[a - base:b - base], recv[a - base:b - base],  # type: ignore[index]
                 target[a - base:b - base])
            if not last:
                self.sreqs[(p.lane, p.step % 2)].append(
                    self.tc.comm.Isend(target[a - base:b - base], dst, RS_DATA + p.lane))


class AllGather(_Ring):
    """One rank's pass over its all-gather pieces into `buf` (all rows; its own shard
    already in place); `arrive[(lane, step, index)]` is when each piece was here."""

    def __init__(self, tc: TimedComm, ls: list[Lane], pieces: list[Piece], width: int,
                 itemsize: float, hooks: RingHooks, buf: np.ndarray | None = None) -> None:
        super().__init__(tc, ls, pieces, width, itemsize, hooks)
        self.buf = buf
        self.arrive: dict[tuple[int, int, int], SimTime] = {}

    def run(self, after_step: "StepHook | None" = None) -> "AllGather":
        size = self.tc.size
        recvs: dict[tuple[int, int, int], tuple[RecvHandle, list[MPI.Request]]] = {}
        for s in range(size):
            if s + 1 < size:
                for p in self.by_step[s + 1]:
                    recvs[(p.lane, p.step, p.index)] = self._post(p)
            for p in self.by_step[s]:
                key = (p.lane, p.step, p.index)
                if s == 0:
                    t = self.hooks.ready(p)
                else:
                    h, preqs = recvs.pop(key)
                    wait_all([*h.reqs, *preqs])
                    self.hooks.received(p, self.nbytes(p))
                    t = h.t_arrive
                self.arrive[key] = t
                if s + 1 < size:        # forward the shard while the rest arrives
                    self.send(p, t, self.buf, AG_TAG, AG_DATA)
            if after_step is not None:
                after_step(s)
        self.close()
        return self

    def _post(self, p: Piece) -> tuple[RecvHandle, list[MPI.Request]]:
        src = self.src[p.lane]
        h = self.tc.irecv(None, src, AG_TAG + p.lane, 0.0, nbytes=self.nbytes(p))
        preqs = []
        if self.buf is not None:
            preqs = [self.tc.comm.Irecv(self.buf[a:b], src, AG_DATA + p.lane)
                     for a, b in _subs(p.rows, self.buf[0:1].nbytes or 1)]
        return h, preqs

    @property
    def end(self) -> SimTime:
        return max(self.arrive.values(), default=-float("inf"))


class StepHook(Protocol):
    def __call__(self, step: int) -> None: ...


def element_lanes(n: int, unit: int, orders: list[tuple[int, ...]]) -> list[Lane]:
    """Lanes over n // unit rows (a row: `unit` elements)."""
    return lanes(n // unit, orders)

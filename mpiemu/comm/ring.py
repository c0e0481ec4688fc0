"""Ring reduce-scatter, all-gather and all-reduce on numpy buffers (thesis 2.4.3.1).

Each array is cut into N chunks (the first `len % N` chunks one element longer, as
`np.array_split`). A ring "lane" moves chunks one way round the ring; the bidirectional
variant runs two lanes at once, the low half of every chunk going to the next rank and the
high half to the previous one, so both directions of every link are busy.
Reduce-scatter with direction d: at step s rank r sends chunk (r - d(s+1)) and receives,
then reduces, chunk (r - d(s+2)); after N-1 steps it holds the sum of chunk r.
Passing `x=None` runs the same schedule on sizes alone (timing-only mode).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from ..sim.timeline import SimTime, Span, latest
from .p2p import TimedComm

TAG_RS, TAG_AG, TAG_RS_DATA = 100, 200, 300
PIECE_BYTES = 1 << 20   # payload pipelining granularity (an emulator detail, not modelled)


def chunk_bounds(n: int, parts: int, offset: int = 0) -> list[tuple[int, int]]:
    """[lo, hi) of each of `parts` chunks of n elements, longer chunks first."""
    q, extra = divmod(n, parts)
    out, lo = [], offset
    for c in range(parts):
        hi = lo + q + (1 if c < extra else 0)
        out.append((lo, hi))
        lo = hi
    return out


@dataclass
class Lane:
    """One direction of travel: d=+1 sends to the next rank, d=-1 to the previous."""

    d: int
    bounds: list[tuple[int, int]]
    t: SimTime

    @property
    def direction(self) -> str:
        return "next" if self.d == 1 else "prev"


def _lanes(n: int, size: int, t0: SimTime, bidirectional: bool, unit: int = 1) -> list[Lane]:
    """Chunk bounds in elements, cut at multiples of `unit` (a row of a 2-D array)."""
    whole = chunk_bounds(n // unit, size)
    if not bidirectional:
        return [Lane(1, [(lo * unit, hi * unit) for lo, hi in whole], t0)]
    mid = [lo + (hi - lo + 1) // 2 for lo, hi in whole]
    lo_half = [(lo * unit, m * unit) for (lo, _), m in zip(whole, mid)]
    hi_half = [(m * unit, hi * unit) for (_, hi), m in zip(whole, mid)]
    return [Lane(1, lo_half, t0), Lane(-1, hi_half, t0)]


def _unit(x: np.ndarray | None, unit: int | None) -> int:
    """Elements per indivisible row: a multi-dim array is scattered along its first axis."""
    if unit is not None:
        return unit
    if x is None or x.ndim <= 1:
        return 1
    return int(np.prod(x.shape[1:]))


def _peers(tc: TimedComm, d: int) -> tuple[int, int]:
    """(destination, source) for a lane of direction d."""
    return (tc.next, tc.prev) if d == 1 else (tc.prev, tc.next)


def _pieces(lo: int, hi: int, itemsize: int) -> list[tuple[int, int]]:
    """Split [lo, hi) into pieces of about PIECE_BYTES for pipelining the payload."""
    k = max(1, -(-(hi - lo) * itemsize // PIECE_BYTES))
    return chunk_bounds(hi - lo, k, lo)


@dataclass
class _RsLane:
    """Payload state of one lane of a pipelined reduce-scatter (numerics on)."""

    lane: Lane
    dst: int
    src: int
    recv: list[np.ndarray]            # two receive buffers, by step parity
    work: list[np.ndarray]            # two partial-sum buffers, by step parity
    rreqs: list[MPI.Request]
    sreqs: list[MPI.Request]


def _rs_steps(tc: TimedComm, x: np.ndarray | None, lanes: list[Lane], itemsize: int,
              out: np.ndarray | None, out_lo: int) -> None:
    """N-1 reduce-scatter steps over all lanes at once (reductions streamed into the sends).

    Emulated time travels in one header per step (tag TAG_RS); the payload travels in pieces
    (tag TAG_RS_DATA) so that the piece j a rank has just reduced is forwarded at once while
    it reduces piece j+1: the ring is pipelined across steps, as NCCL does with its slices.
    `x` is never copied whole; the last step writes straight into `out` (from `out_lo` on).
    """
    n_size, r = tc.size, tc.rank
    bounds = [[lane.bounds[(r - lane.d * (s + 2)) % n_size] for s in range(n_size - 1)]
              for lane in lanes]                        # chunk each lane reduces at step s
    first = [lane.bounds[(r - lane.d) % n_size] for lane in lanes]
    pay = _rs_payload_start(tc, x, lanes, bounds, first, itemsize)
    heads = [tc.irecv(None, _peers(tc, lane.d)[1], TAG_RS + i, lane.t)
             for i, lane in enumerate(lanes)]
    sends = [tc.isend(None, _peers(tc, lane.d)[0], TAG_RS + i,
                      (first[i][1] - first[i][0]) * itemsize, lane.t,
                      direction=lane.direction, label="rs.send", stage=0)
             for i, lane in enumerate(lanes)]
    for s in range(n_size - 1):
        for i, lane in enumerate(lanes):
            t_arrive = heads[i].wait()
            rlo, rhi = bounds[i][s]
            n = rhi - rlo
            red = tc.reduce_s(n, itemsize)
            sends[i].wait()
            if s < n_size - 2:
                # steady step: local + received is streamed to the next rank as it is summed,
                # so the step lasts alpha + max(bytes/beta, reduction) (thesis 8.5.1.1: only
                # the last step's reduction is exposed)
                dst, src = _peers(tc, lane.d)
                heads[i] = tc.irecv(None, src, TAG_RS + i, t_arrive)
                sends[i] = tc.isend(None, dst, TAG_RS + i, n * itemsize, t_arrive,
                                    direction=lane.direction, label="rs.send", stage=s + 1,
                                    duration=tc.link.latency_s + max(  # lanes share DRAM
                                        n * itemsize / tc.link.bw_bytes_per_s, red * len(lanes)),
                                    dram_bytes=3 * n * itemsize)
                lane.t = sends[i].span.t_start
            else:           # last step: the sum stays here (lanes take turns on the stream)
                lane.t = tc.tl.reserve("rs.reduce", [tc.stream], red, t_arrive, cat="comm",
                                       flops=n, dram_bytes=3 * n * itemsize,
                                       peer=heads[i].source, stage=s).t_end
        if pay is not None:
            _rs_payload_step(tc, x, pay, bounds, s, itemsize, out, out_lo)  # type: ignore[arg-type]


def _rs_payload_start(tc: TimedComm, x: np.ndarray | None, lanes: list[Lane],
                      bounds: list[list[tuple[int, int]]], first: list[tuple[int, int]],
                      itemsize: int) -> list[_RsLane] | None:
    """Post step 0's payload: send own chunk pieces, receive the first partial sums."""
    if x is None:
        return None
    width = max(hi - lo for lane in lanes for lo, hi in lane.bounds)
    pay = []
    for i, lane in enumerate(lanes):
        dst, src = _peers(tc, lane.d)
        p = _RsLane(lane, dst, src, [tc.scratch(f"rs.recv{i}.{j}", width, x.dtype) for j in (0, 1)],
                    [tc.scratch(f"rs.work{i}.{j}", width, x.dtype) for j in (0, 1)], [], [])
        _post_recv_pieces(tc, p, bounds[i][0], 0, x.itemsize, i)
        slo, shi = first[i]
        p.sreqs = [tc.comm.Isend(x[a:b], dst, TAG_RS_DATA + i)
                   for a, b in _pieces(slo, shi, x.itemsize)]
        pay.append(p)
    return pay


def _post_recv_pieces(tc: TimedComm, p: _RsLane, chunk: tuple[int, int], s: int,
                      real_itemsize: int, i: int) -> None:
    lo, hi = chunk
    buf = p.recv[s % 2]
    p.rreqs = [tc.comm.Irecv(buf[a - lo:b - lo], p.src, TAG_RS_DATA + i)
               for a, b in _pieces(lo, hi, real_itemsize)]


def _rs_payload_step(tc: TimedComm, x: np.ndarray, pay: list[_RsLane],
                     bounds: list[list[tuple[int, int]]], s: int, itemsize: int,
                     out: np.ndarray | None, out_lo: int) -> None:
    """Reduce step s piece by piece, forwarding each reduced piece for step s+1 at once."""
    last = s == tc.size - 2
    for i, p in enumerate(pay):
        rreqs, sreqs = p.rreqs, p.sreqs
        lo, hi = bounds[i][s]
        if not last:
            _post_recv_pieces(tc, p, bounds[i][s + 1], s + 1, x.itemsize, i)
        target = (out[lo - out_lo:hi - out_lo] if last          # type: ignore[index]
                  else p.work[s % 2][:hi - lo])
        recv = p.recv[s % 2]
        fwd = []
        for req, (a, b) in zip(rreqs, _pieces(lo, hi, x.itemsize)):
            req.Wait()
            np.add(x[a:b], recv[a - lo:b - lo], out=target[a - lo:b - lo])  # local + received
            if not last:
                fwd.append(tc.comm.Isend(target[a - lo:b - lo], p.dst, TAG_RS_DATA + i))
        MPI.Request.Waitall(sreqs)       # what we sent last step may now be overwritten
        p.sreqs = fwd


def _ag_steps(tc: TimedComm, buf: np.ndarray | None, lanes: list[Lane], itemsize: int
              ) -> None:
    """N-1 all-gather steps: forward the chunk received last step, receive in place."""
    n_size, r = tc.size, tc.rank
    for s in range(n_size - 1):
        posted = []
        for i, lane in enumerate(lanes):
            dst, src = _peers(tc, lane.d)
            slo, shi = lane.bounds[(r - lane.d * s) % n_size]
            rlo, rhi = lane.bounds[(r - lane.d * (s + 1)) % n_size]
            rh = tc.irecv(buf[rlo:rhi] if buf is not None else None, src, TAG_AG + i, lane.t)
            sh = tc.isend(buf[slo:shi] if buf is not None else None, dst, TAG_AG + i,
                          (shi - slo) * itemsize, lane.t, direction=lane.direction,
                          label="ag.send", stage=s)
            posted.append((lane, rh, sh))
        for lane, rh, sh in posted:
            lane.t = rh.wait()
            sh.wait()


def _size(x: np.ndarray | None, count: int | None) -> int:
    if x is not None:
        return int(x.size)
    if count is None or count < 0:
        raise ValueError(f"timing-only collectives need count >= 0, got {count}")
    return count


def _itemsize(x: np.ndarray | None, wire_itemsize: int | None) -> int:
    if wire_itemsize is not None:
        return wire_itemsize
    return x.itemsize if x is not None else 4


def _out(out: np.ndarray | None, n: int, dtype: np.dtype) -> np.ndarray:
    """The caller's output buffer (checked) or a new one."""
    if out is None:
        return np.empty(n, dtype)
    if out.size != n or out.dtype != dtype or not out.flags.c_contiguous:
        raise ValueError(f"out must be a contiguous {dtype} array of {n} elements, got "
                         f"{out.dtype} with {out.size}")
    return out.reshape(-1)


def reduce_scatter(tc: TimedComm, x: np.ndarray | None, *, after: SimTime = 0.0,
                   count: int | None = None, wire_itemsize: int | None = None,
                   bidirectional: bool = False, label: str = "reduce_scatter",
                   out: np.ndarray | None = None, unit: int | None = None
                   ) -> tuple[np.ndarray | None, Span]:
    """Sum x over the ring and keep chunk `rank` of the result (rows of a 2-D x).

    forward: reduce-scatter; its conjugate (backward) is `all_gather`.
    """
    n, itemsize, t0 = _size(x, count), _itemsize(x, wire_itemsize), latest(after)
    u = _unit(x, unit)
    if tc.size == 1:
        return (None if x is None else x.copy()), Span(t0, t0)
    flat = None if x is None else np.ascontiguousarray(x).reshape(-1)
    lo, hi = (b * u for b in chunk_bounds(n // u, tc.size)[tc.rank])
    res = None if flat is None else _out(out, hi - lo, flat.dtype)
    lanes = _lanes(n, tc.size, t0, bidirectional, u)
    _rs_steps(tc, flat, lanes, itemsize, res, lo)
    span = Span(t0, max(lane.t for lane in lanes))
    tc.tl.summary(label, span, resource=f"coll.{tc.name}", nbytes=n * itemsize)
    if res is not None and x is not None and x.ndim > 1:
        res = res.reshape(-1, *x.shape[1:])
    return res, span


def all_gather(tc: TimedComm, x: np.ndarray | None, *, total: int | None = None,
               after: SimTime = 0.0, count: int | None = None,
               wire_itemsize: int | None = None, bidirectional: bool = False,
               label: str = "all_gather", out: np.ndarray | None = None,
               unit: int | None = None) -> tuple[np.ndarray | None, Span]:
    """Concatenate every rank's chunk in rank order (rows of a 2-D x; `total` elements).

    forward: all-gather; its conjugate (backward) is `reduce_scatter`.
    """
    itemsize, t0 = _itemsize(x, wire_itemsize), latest(after)
    n = total if total is not None else _size(x, count) * tc.size
    u = _unit(x, unit)
    if tc.size == 1:
        return (None if x is None else x.copy()), Span(t0, t0)
    lo, hi = (b * u for b in chunk_bounds(n // u, tc.size)[tc.rank])
    buf = None
    if x is not None:
        if x.size != hi - lo:
            raise ValueError(f"all_gather: rank {tc.rank} holds {x.size} elements but chunk "
                             f"{tc.rank} of {n} has {hi - lo}")
        buf = _out(out, n, x.dtype)
        buf[lo:hi] = x.reshape(-1)
    lanes = _lanes(n, tc.size, t0, bidirectional, u)
    _ag_steps(tc, buf, lanes, itemsize)
    span = Span(t0, max(lane.t for lane in lanes))
    tc.tl.summary(label, span, resource=f"coll.{tc.name}", nbytes=n * itemsize)
    if buf is not None and x is not None and x.ndim > 1:
        buf = buf.reshape(-1, *x.shape[1:])
    return buf, span


def all_reduce(tc: TimedComm, x: np.ndarray | None, *, after: SimTime = 0.0,
               count: int | None = None, wire_itemsize: int | None = None,
               bidirectional: bool = False, label: str = "all_reduce",
               out: np.ndarray | None = None, unit: int = 1
               ) -> tuple[np.ndarray | None, Span]:
    """Ring all-reduce = reduce-scatter then all-gather on the same chunks, 2(N-1) steps."""
    n, itemsize, t0 = _size(x, count), _itemsize(x, wire_itemsize), latest(after)
    if tc.size == 1:
        return (None if x is None else x.copy()), Span(t0, t0)
    flat = None if x is None else np.ascontiguousarray(x).reshape(-1)
    buf = None if flat is None else _out(out, n, flat.dtype)
    lanes = _lanes(n, tc.size, t0, bidirectional, unit)
    _rs_steps(tc, flat, lanes, itemsize, buf, 0)    # chunk r's sum lands in buf
    _ag_steps(tc, buf, lanes, itemsize)
    span = Span(t0, max(lane.t for lane in lanes))
    tc.tl.summary(label, span, resource=f"coll.{tc.name}", nbytes=n * itemsize)
    return (None if buf is None else buf.reshape(x.shape)), span  # type: ignore[union-attr]

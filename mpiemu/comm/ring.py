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

from ..sim.timeline import SimTime, Span, latest
from .p2p import TimedComm

TAG_RS, TAG_AG = 100, 200


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


def _lanes(n: int, size: int, t0: SimTime, bidirectional: bool) -> list[Lane]:
    whole = chunk_bounds(n, size)
    if not bidirectional:
        return [Lane(1, whole, t0)]
    lo_half = [(lo, lo + (hi - lo + 1) // 2) for lo, hi in whole]
    hi_half = [(lo + (hi - lo + 1) // 2, hi) for lo, hi in whole]
    return [Lane(1, lo_half, t0), Lane(-1, hi_half, t0)]


def _peers(tc: TimedComm, d: int) -> tuple[int, int]:
    """(destination, source) for a lane of direction d."""
    return (tc.next, tc.prev) if d == 1 else (tc.prev, tc.next)


def _rs_steps(tc: TimedComm, buf: np.ndarray | None, lanes: list[Lane], itemsize: int
              ) -> None:
    """N-1 reduce-scatter steps over all lanes at once; reductions on the comm stream."""
    n_size, r = tc.size, tc.rank
    width = max(hi - lo for lane in lanes for lo, hi in lane.bounds)
    scratch = [np.empty(width, buf.dtype) if buf is not None else None for _ in lanes]
    for s in range(n_size - 1):
        posted = []
        for i, lane in enumerate(lanes):
            dst, src = _peers(tc, lane.d)
            slo, shi = lane.bounds[(r - lane.d * (s + 1)) % n_size]
            rlo, rhi = lane.bounds[(r - lane.d * (s + 2)) % n_size]
            rbuf = scratch[i][:rhi - rlo] if buf is not None else None  # type: ignore[index]
            rh = tc.irecv(rbuf, src, TAG_RS + i, lane.t)
            sh = tc.isend(buf[slo:shi] if buf is not None else None, dst, TAG_RS + i,
                          (shi - slo) * itemsize, lane.t, direction=lane.direction,
                          label="rs.send", stage=s)
            posted.append((lane, rh, sh, rlo, rhi, rbuf))
        for lane, rh, sh, rlo, rhi, rbuf in posted:
            t_arrive = rh.wait()
            if buf is not None:
                np.add(buf[rlo:rhi], rbuf, out=buf[rlo:rhi])   # local + received partial
            n = rhi - rlo
            lane.t = tc.tl.reserve("rs.reduce", [tc.stream], tc.reduce_s(n, itemsize),
                                   t_arrive, cat="comm", flops=n, dram_bytes=3 * n * itemsize,
                                   peer=rh.source, stage=s).t_end
            sh.wait()


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


def reduce_scatter(tc: TimedComm, x: np.ndarray | None, *, after: SimTime = 0.0,
                   count: int | None = None, wire_itemsize: int | None = None,
                   bidirectional: bool = False, label: str = "reduce_scatter"
                   ) -> tuple[np.ndarray | None, Span]:
    """Sum x over the ring and keep chunk `rank` of the result.

    forward: reduce-scatter; its conjugate (backward) is `all_gather`.
    """
    n, itemsize, t0 = _size(x, count), _itemsize(x, wire_itemsize), latest(after)
    if tc.size == 1:
        return (None if x is None else x.reshape(-1).copy()), Span(t0, t0)
    buf = None if x is None else np.ascontiguousarray(x).reshape(-1).copy()
    lanes = _lanes(n, tc.size, t0, bidirectional)
    _rs_steps(tc, buf, lanes, itemsize)
    span = Span(t0, max(lane.t for lane in lanes))
    tc.tl.summary(label, span, resource=f"coll.{tc.name}", nbytes=n * itemsize)
    if buf is None:
        return None, span
    lo, hi = chunk_bounds(n, tc.size)[tc.rank]
    return buf[lo:hi].copy(), span


def all_gather(tc: TimedComm, x: np.ndarray | None, *, total: int | None = None,
               after: SimTime = 0.0, count: int | None = None,
               wire_itemsize: int | None = None, bidirectional: bool = False,
               label: str = "all_gather") -> tuple[np.ndarray | None, Span]:
    """Concatenate every rank's chunk in rank order (chunks sized as `chunk_bounds`).

    forward: all-gather; its conjugate (backward) is `reduce_scatter`.
    """
    itemsize, t0 = _itemsize(x, wire_itemsize), latest(after)
    n = total if total is not None else _size(x, count) * tc.size
    if tc.size == 1:
        return (None if x is None else x.reshape(-1).copy()), Span(t0, t0)
    lo, hi = chunk_bounds(n, tc.size)[tc.rank]
    buf = None
    if x is not None:
        if x.size != hi - lo:
            raise ValueError(f"all_gather: rank {tc.rank} holds {x.size} elements but chunk "
                             f"{tc.rank} of {n} has {hi - lo}")
        buf = np.empty(n, x.dtype)
        buf[lo:hi] = x.reshape(-1)
    lanes = _lanes(n, tc.size, t0, bidirectional)
    _ag_steps(tc, buf, lanes, itemsize)
    span = Span(t0, max(lane.t for lane in lanes))
    tc.tl.summary(label, span, resource=f"coll.{tc.name}", nbytes=n * itemsize)
    return buf, span


def all_reduce(tc: TimedComm, x: np.ndarray | None, *, after: SimTime = 0.0,
               count: int | None = None, wire_itemsize: int | None = None,
               bidirectional: bool = False, label: str = "all_reduce"
               ) -> tuple[np.ndarray | None, Span]:
    """Ring all-reduce = reduce-scatter then all-gather on the same chunks, 2(N-1) steps."""
    n, itemsize, t0 = _size(x, count), _itemsize(x, wire_itemsize), latest(after)
    if tc.size == 1:
        return (None if x is None else x.copy()), Span(t0, t0)
    buf = None if x is None else np.ascontiguousarray(x).reshape(-1).copy()
    lanes = _lanes(n, tc.size, t0, bidirectional)
    _rs_steps(tc, buf, lanes, itemsize)
    _ag_steps(tc, buf, lanes, itemsize)
    span = Span(t0, max(lane.t for lane in lanes))
    tc.tl.summary(label, span, resource=f"coll.{tc.name}", nbytes=n * itemsize)
    return (None if buf is None else buf.reshape(x.shape)), span  # type: ignore[union-attr]

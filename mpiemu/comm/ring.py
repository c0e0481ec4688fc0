"""The ring engine: reduce-scatter and all-gather steps over lanes (thesis 2.4.3.1).

An array is cut into N chunks (`schedule.chunk_bounds`, longer chunks first, as
`np.array_split`); each lane (`schedule.Lane`) is one ring with its order of ranks and its
share of every chunk. One lane is the plain ring; the bidirectional ring adds the reversed
order on the high halves; a ring whose ranks span nodes runs one lane per rail, each entering
and leaving every node at a different device, so every NIC carries a share (NCCL's channels;
`ring_orders`). Reduce-scatter: at step s a rank sends the chunk `lane.rs_chunk(rank, s)` and
reduces the one it receives; after N-1 steps it holds the sum of its own chunk. All-gather:
at step s it forwards the shard of `lane.ag_owner(rank, s)`.

Every message goes through `TimedComm.isend` (the network's one message path). `x=None`
runs the same schedule on sizes alone (timing-only mode).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from ..net.message import Feed
from ..sim.timeline import SimTime
from .p2p import TimedComm
from .schedule import Lane, chunk_bounds, lanes

TAG_RS, TAG_AG, TAG_RS_DATA = 100, 200, 300
PIECE_BYTES = 1 << 20   # payload pipelining granularity (an emulator detail, not modelled)


def ring_orders(tc: TimedComm, bidirectional: bool = False) -> list[tuple[int, ...]]:
    """Orders of the ring's lanes: rank order, or one rotated order per rail when the ranks
    sit on several nodes with more than one each (so lane j leaves every node from its j-th
    member: rail-optimised, as NCCL's channels); the reversed orders too if bidirectional."""
    by_node: dict[int, list[int]] = {}
    for r, d in enumerate(tc.devices):
        by_node.setdefault(tc.net.node_of(d), []).append(r)
    groups = list(by_node.values())
    k = len(groups[0])
    if len(groups) > 1 and k > 1 and all(len(g) == k for g in groups):
        orders = [tuple(m for g in groups for m in g[j:] + g[:j]) for j in range(k)]
    else:
        orders = [tuple(range(tc.size))]
    if bidirectional:
        orders += [tuple(reversed(o)) for o in orders]
    return orders


def element_lanes(n: int, unit: int, orders: list[tuple[int, ...]]) -> list[Lane]:
    """Lanes over n elements cut at multiples of `unit` (a row of a 2-D array)."""
    return [Lane(ln.index, ln.order, tuple((lo * unit, hi * unit) for lo, hi in ln.bounds))
            for ln in lanes(n // unit, orders)]


def _fixed(seconds: SimTime) -> Feed:
    """A feed that needs the same time whenever the send starts."""
    return lambda _start: seconds


def _pieces(lo: int, hi: int, itemsize: int) -> list[tuple[int, int]]:
    """Split [lo, hi) into pieces of about PIECE_BYTES for pipelining the payload."""
    k = max(1, -(-(hi - lo) * itemsize // PIECE_BYTES))
    return chunk_bounds(hi - lo, k, lo)


@dataclass
class _RsLane:
    """Payload state of one lane of a pipelined reduce-scatter (numerics on)."""

    dst: int
    src: int
    recv: list[np.ndarray]            # two receive buffers, by step parity
    work: list[np.ndarray]            # two partial-sum buffers, by step parity
    rreqs: list[MPI.Request]
    sreqs: list[MPI.Request]


def rs_steps(tc: TimedComm, x: np.ndarray | None, ls: list[Lane], itemsize: int,
             out: np.ndarray | None, out_lo: int, t: list[SimTime]) -> None:
    """N-1 reduce-scatter steps over all lanes at once (reductions streamed into the sends);
    `t[i]` is when lane i may start, and on return when its last reduction ended.

    Emulated time travels in one header per step (tag TAG_RS); the payload travels in pieces
    (tag TAG_RS_DATA) so that the piece a rank has just reduced is forwarded at once while it
    reduces the next: the ring is pipelined across steps, as NCCL does with its slices.
    `x` is never copied whole; the last step writes straight into `out` (from `out_lo` on).
    """
    n_size, r = tc.size, tc.rank
    bounds = [[ln.bounds[ln.rs_chunk(r, s + 1)] for s in range(n_size - 1)] for ln in ls]
    first = [ln.bounds[ln.rs_chunk(r, 0)] for ln in ls]
    pay = _rs_payload_start(tc, x, ls, bounds, first)
    heads = [tc.irecv(None, ln.peers(r)[1], TAG_RS + i, t[i]) for i, ln in enumerate(ls)]
    sends = [tc.isend(None, ln.peers(r)[0], TAG_RS + i, (first[i][1] - first[i][0]) * itemsize,
                      t[i], label="rs.send", stage=0) for i, ln in enumerate(ls)]
    for s in range(n_size - 1):
        for i, ln in enumerate(ls):
            t_arrive = heads[i].wait()
            rlo, rhi = bounds[i][s]
            n = rhi - rlo
            red = tc.reduce_s(n, itemsize)
            sends[i].wait()
            if s < n_size - 2:
                # steady step: local + received is streamed to the next rank as it is summed,
                # so the port is busy for max(wire, reduction) (thesis 8.5.1.1: only the
                # last step's reduction is exposed); the lanes share the DRAM that feeds it
                dst, src = ln.peers(r)
                heads[i] = tc.irecv(None, src, TAG_RS + i, t_arrive)
                sends[i] = tc.isend(None, dst, TAG_RS + i, n * itemsize, t_arrive,
                                    label="rs.send", stage=s + 1, feed=_fixed(red * len(ls)),
                                    dram_bytes=3 * n * itemsize)
                t[i] = sends[i].t_start
            else:           # last step: the sum stays here (lanes take turns on the stream)
                t[i] = tc.tl.reserve("rs.reduce", [tc.stream], red, t_arrive, cat="comm",
                                     flops=n, dram_bytes=3 * n * itemsize,
                                     peer=heads[i].source, stage=s).t_end
        if pay is not None:
            _rs_payload_step(tc, x, pay, bounds, s, out, out_lo)  # type: ignore[arg-type]


def _rs_payload_start(tc: TimedComm, x: np.ndarray | None, ls: list[Lane],
                      bounds: list[list[tuple[int, int]]], first: list[tuple[int, int]]
                      ) -> list[_RsLane] | None:
    """Post step 0's payload: send own chunk pieces, receive the first partial sums."""
    if x is None:
        return None
    width = max(hi - lo for ln in ls for lo, hi in ln.bounds)
    pay = []
    for i, ln in enumerate(ls):
        dst, src = ln.peers(tc.rank)
        p = _RsLane(dst, src, [tc.scratch(f"rs.recv{i}.{j}", width, x.dtype) for j in (0, 1)],
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
                     bounds: list[list[tuple[int, int]]], s: int,
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


def ag_steps(tc: TimedComm, buf: np.ndarray | None, ls: list[Lane], itemsize: int,
             t: list[SimTime]) -> None:
    """N-1 all-gather steps: forward the chunk received last step, receive in place;
    `t[i]` is when lane i may start, and on return when its last chunk arrived."""
    r = tc.rank
    for s in range(tc.size - 1):
        posted = []
        for i, ln in enumerate(ls):
            dst, src = ln.peers(r)
            slo, shi = ln.bounds[ln.ag_owner(r, s)]
            rlo, rhi = ln.bounds[ln.ag_owner(r, s + 1)]
            rh = tc.irecv(buf[rlo:rhi] if buf is not None else None, src, TAG_AG + i, t[i])
            sh = tc.isend(buf[slo:shi] if buf is not None else None, dst, TAG_AG + i,
                          (shi - slo) * itemsize, t[i], label="ag.send", stage=s)
            posted.append((i, rh, sh))
        for i, rh, sh in posted:
            t[i] = rh.wait()
            sh.wait()

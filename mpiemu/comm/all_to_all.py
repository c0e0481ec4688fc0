"""All-to-all(v) as NCCL runs it: a grouped send and receive to every peer, each a timed
point-to-point message on the one message path (`TimedComm.isend` / `irecv`).

What NCCL does, and what is taken from it:

* nccl-tests' `alltoall_perf` calls `ncclAlltoAll` (NCCL >= 2.28) or, before, a group of
  `ncclSend` / `ncclRecv` of count elements to and from every rank
  (NVIDIA/nccl-tests a0b82b2 src/alltoall.cu:313-333); NCCL turns `ncclAlltoAll` into the
  same send and receive task per peer (NVIDIA/nccl 5067397c src/enqueue.cc:3070-3082).
  Its size S is a rank's whole send buffer, S / n to each peer; busbw = S / t x (n-1)/n
  (src/alltoall.cu:48-53, doc/PERFORMANCE.md).
* The p2p scheduler visits peers in rounds (NCCL v2.21.5-1 src/init.cc:1305-1340): node
  deltas in the order 0, +1, -1, +2, -2, ... (`node_deltas`), and for each delta d, round s
  sends to local rank (l + s) of node (N + d) and receives from local rank (l - s) of node
  (N - d) (5067397c src/init.cc:932-950 permutes the deltas quadratically; the rounds keep
  this shape). On one node that is send to (rank + s) % n, receive from (rank - s) % n.
  Every round is a permutation, so the messages a NIC or port carries line up slot by slot
  across ranks. All are issued at once; the order decides how the ports' calendars
  (`sim.calendar`) fill, so each port carries the sum of its messages.
* Zero-byte sends and receives are synchronisations (v2.21.5-1 src/enqueue.cc:937-939):
  here a header without payload, on the same path.
* p2p runs the Simple protocol with `p2pnChannelsPerPeer` channels per peer and
  NCHANNELS_PER_NET_PEER across nodes (v2.21.5-1 src/graph/paths.cc:692-764), its chunks
  512 KiB on NVLink and 128 KiB on the network (src/init.cc:818-820 at 5067397c). Peers
  share one port here as a calendar (each message at the port's full rate, in issue order),
  so the channel share of a call is the one NCCL gives a collective of the call's wire bytes
  (`NetworkSpec.channel_share`, `comm.cost.p2p_share`): the port's whole rate once the call
  is large; a per-peer fraction would be charged n-1 times over on the shared calendar.
* The call pays the network's base latency of a Simple ring call (baseLat[Ring][Simple]
  x `call_latency_scale`: NCCL's tuning has no p2p row; a p2p kernel launches the same way)
  and each message its hop's Simple latency (hwLat, x `hop_latency_scale.simple`).

The closed form is `comm.cost.all_to_all_s` (exact on one switch node with equal counts:
base + (n-1) b / B + a). A folded (`FoldedComm`) group runs it only timing-only and with equal
counts, where every member's sends are images of this rank's (`FoldError` otherwise).
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ..sim.timeline import SimTime, Span, latest
from .collectives import _record
from .cost import P2P_ALGORITHM, p2p_share
from .folded import FoldError, FoldedComm
from .p2p import Call, RecvHandle, SendHandle, TimedComm, wait_all
from .tuner import Choice, node_groups

__all__ = ["TAG_A2A", "all_to_all_v", "node_deltas", "rounds"]

TAG_A2A = 6000   # header and payload of every message of a call (ring 100-499, tree 5000+,
                 # CP 700-701, pipeline 0..2v+1): one (source, tag) stream per peer, FIFO
PROTOCOL = "simple"


def node_deltas(nodes: int) -> list[int]:
    """The node offsets NCCL's p2p schedule visits, in order: 0, +1, -1, +2, -2, ... and
    n/2 once (v2.21.5-1 src/init.cc:1312-1339, transcribed)."""
    out: list[int] = []
    for d in range(nodes // 4 + 1):
        deltas = (d, (nodes - d) % nodes, nodes // 2 - d, (nodes - (nodes // 2 - d)) % nodes)
        index = 0
        while index < 4:
            out.append(deltas[index])
            index += 1
            if index == 1 and deltas[1] == deltas[0]:
                index += 1
            if index == 2 and deltas[2] == deltas[0]:
                index += 1
            if index == 3 and deltas[3] == deltas[2]:
                index += 1
            if index == 3 and deltas[3] == deltas[1]:
                index += 1
    assert sorted(out) == list(range(nodes)), (nodes, out)
    return out


def rounds(tc: TimedComm) -> list[tuple[int, int]]:
    """This rank's (send peer, receive peer) of every round of NCCL's p2p schedule over the
    group's nodes (`tuner.node_groups`), -1 where a round has none (itself, or a local index
    a smaller node lacks); remembered per group."""
    got = tc.memo.get(("a2a_rounds",))
    if got is None:
        groups = node_groups(tc.net, tc.devices)
        node = next(k for k, g in enumerate(groups) if tc.rank in g)
        local, steps, nodes = groups[node].index(tc.rank), max(map(len, groups)), len(groups)

        def peer(g: list[int], i: int) -> int:
            return g[i] if i < len(g) and g[i] != tc.rank else -1
        got = tc.memo[("a2a_rounds",)] = [
            (peer(groups[(node + d) % nodes], (local + s) % steps),
             peer(groups[(node - d) % nodes], (local - s) % steps))
            for d in node_deltas(nodes) for s in range(steps)]
    return got


def _check_counts(n: int, send_counts: Sequence[int], recv_counts: Sequence[int],
                  rank: int) -> None:
    if len(send_counts) != n or len(recv_counts) != n:
        raise ValueError(f"all_to_all_v: {len(send_counts)} send and {len(recv_counts)} "
                         f"receive counts for a group of {n}")
    if min([*send_counts, *recv_counts], default=0) < 0:
        raise ValueError("all_to_all_v: counts must be >= 0")
    if send_counts[rank] != recv_counts[rank]:
        raise ValueError(f"all_to_all_v: rank {rank} sends {send_counts[rank]} rows to itself "
                         f"but expects {recv_counts[rank]}")


def _layout(chunks: Sequence[np.ndarray | None] | None, send_counts: Sequence[int],
            unit: int, rank: int) -> tuple[np.dtype | None, tuple[int, ...]]:
    """The payload's dtype and the shape of one row (() for flat chunks), checked."""
    if chunks is None:
        return None, ()
    if len(chunks) != len(send_counts):
        raise ValueError(f"all_to_all_v: {len(chunks)} chunks for {len(send_counts)} ranks")
    mine = chunks[rank]
    if mine is None:
        raise ValueError("all_to_all_v: chunks must all be arrays (or chunks=None)")
    tail = tuple(mine.shape[1:]) if mine.ndim > 1 else ()
    if tail and math.prod(tail) != unit:
        raise ValueError(f"all_to_all_v: rows of shape {tail} but unit={unit}")
    for j, c in enumerate(chunks):
        if c is None or c.dtype != mine.dtype or c.size != send_counts[j] * unit:
            raise ValueError(f"all_to_all_v: chunk {j} must be a {mine.dtype} array of "
                             f"{send_counts[j]} rows of {unit} elements")
    return mine.dtype, tail


def _check_fold(tc: TimedComm, chunks: object, send_counts: Sequence[int],
                recv_counts: Sequence[int]) -> None:
    """On a folded group every member must send what this rank sends (its images)."""
    if chunks is not None:
        raise FoldError(f"run.fold: the {tc.name} group moves all-to-all payload (numerics "
                        "on); run with run.fold = \"off\"")
    peers = [j for j in range(tc.size) if j != tc.rank]
    if len({*(send_counts[j] for j in peers), *(recv_counts[j] for j in peers)}) > 1:
        raise FoldError(f"run.fold: the {tc.name} group runs an all-to-all of uneven counts, "
                        "whose ranks differ, so folding would not be exact; run with "
                        "run.fold = \"off\"")


def all_to_all_v(tc: TimedComm, chunks: Sequence[np.ndarray | None] | None,
                 send_counts: Sequence[int], recv_counts: Sequence[int], *, itemsize: float,
                 after: SimTime = 0.0, label: str = "all_to_all", unit: int = 1,
                 tag: int = TAG_A2A) -> tuple[list[np.ndarray | None], Span]:
    """Send `chunks[j]` (`send_counts[j]` rows of `unit` elements, `itemsize` bytes each on
    the wire) to rank j and receive `recv_counts[i]` rows from rank i, as NCCL's alltoallv.

    `chunks=None`: timing only (headers alone travel). Returns the received arrays in source
    order (shaped like this rank's own chunk: flat, or rows of its trailing shape; None when
    timing only) and the call's span, from `after` to when the last receive arrived. The own
    chunk is copied, not sent. `tag`: the messages' tag on this communicator (one call in
    flight per tag). Its own conjugate: a backward all-to-all swaps the counts.
    """
    n, me, t0 = tc.size, tc.rank, latest(after)
    _check_counts(n, send_counts, recv_counts, me)
    dtype, tail = _layout(chunks, send_counts, unit, me)
    out: list[np.ndarray | None] = [None] * n
    if chunks is not None:
        out[me] = np.array(chunks[me], copy=True)
    if n == 1:
        return out, Span(t0, t0)
    if isinstance(tc.comm, FoldedComm):
        _check_fold(tc, chunks, send_counts, recv_counts)
    row = unit * itemsize
    wire = sum(send_counts[j] for j in range(n) if j != me) * row
    call = Call(PROTOCOL, p2p_share(tc, wire), P2P_ALGORITHM)
    t = t0 + tc.net.spec.base(P2P_ALGORITHM, PROTOCOL)
    order = rounds(tc)
    recvs: list[RecvHandle] = []
    for _, src in order:           # receives first: every send finds its receive posted
        if src >= 0:
            buf = None if dtype is None else np.empty(recv_counts[src] * unit, dtype)
            out[src] = buf
            recvs.append(tc.irecv(buf, src, tag, t, nbytes=recv_counts[src] * row))
    sends: list[SendHandle] = []
    for dst, _ in order:
        if dst >= 0:
            data = None if chunks is None else np.ascontiguousarray(chunks[dst]).reshape(-1)
            sends.append(tc.isend(data, dst, tag, send_counts[dst] * row, t, call,
                                  label="a2a.send"))
    end = t0
    for h in recvs:                # ingress reserved in schedule order
        end = max(end, h.wait())
    wait_all([r for s in sends for r in s.reqs])
    span = Span(t0, end)
    _record(tc, label, span, wire, Choice(P2P_ALGORITHM, PROTOCOL))
    if tail:
        out = [None if a is None else a.reshape(-1, *tail) for a in out]
    return out, span

"""NCCL's tree all-reduce across nodes: a chain inside each node, a binary tree between nodes,
two trees at once (NCCL's double binary tree) on every rail, pipelined in segments.

NCCL runs its trees on every channel, and a channel's chain leaves the node through its own
NIC (rail-optimised nodes: one NIC per GPU; src/graph/search.cc searches the tree graph per
NIC as it does the ring's), so a node of G devices runs G lanes, as the ring does
(`ring.ring_orders`). Lane j carries 1/G of the buffer in two trees, half each. Its tree A
chains a node's devices towards local rank j (the head, whose NIC joins the tree across
nodes; node 0 at the root, parent of node i = (i-1)//2); its tree B runs the same chain the
other way, towards local rank j-1, and mirrors the node order, so its heads and interior
nodes are other devices and NICs (NCCL's `ncclGetDtree` builds the two trees so that a
node's interior in one is a leaf in the other; the mirrored heap is a simpler shape with
the same load spread, stated in docs/network.md). Every NIC heads one tree A and one tree B.
Reduce: every device adds what its chain and tree children sent to its own data (one
reduction each) and sends the sum up; broadcast: the root's sum travels back down the same
edges. Segments (`cost.pipeline_depth`) are issued one after the other, so a later segment
climbs while an earlier one descends (ports are calendars). Every message is a real message
through `TimedComm` (header, and payload with numerics on).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from mpi4py import MPI

from ..sim.timeline import SimTime
from .p2p import Call, RecvHandle, TimedComm, wait_all
from .ring import Reduction
from .lanes import chunk_bounds

TAG_TREE = 5000     # tree i of a call: TAG_TREE + 2i (climbing), + 2i + 1 (descending)


class TreeRole(NamedTuple):
    """A rank's place in one tree: whom it hears from going up, whom it sends to."""

    up_from: tuple[int, ...]         # chain child and, for a head, the node-tree children
    up_to: int                       # -1: the root of the whole tree
    tree: int                        # 2 x lane + (0: A, 1: B): tags and payload parts

    @property
    def down_from(self) -> int:
        return self.up_to

    @property
    def down_to(self) -> tuple[int, ...]:
        return self.up_from


def _chains(groups: list[list[int]], lane: int, side: int) -> list[list[int]]:
    """The node chains of one tree, head first, nodes in that tree's order."""
    nodes = groups if side == 0 else groups[::-1]
    chains = [g[lane:] + g[:lane] for g in nodes]
    return [c[::-1] for c in chains] if side else chains


def edges(groups: list[list[int]]) -> list[tuple[int, int]]:
    """Every (child, parent) edge of every tree of every lane (what `roles` gives each
    rank, for all ranks at once)."""
    out = []
    for lane in range(len(groups[0])):
        for side in (0, 1):
            chains = _chains(groups, lane, side)
            for i, chain in enumerate(chains):
                out += [(chain[p], chain[p - 1]) for p in range(1, len(chain))]
                if i > 0:
                    out.append((chain[0], chains[(i - 1) // 2][0]))
    return out


def roles(groups: list[list[int]], rank: int) -> list[TreeRole]:
    """This rank's role in the trees A and B of every lane (`groups`: ranks by node, equal
    sizes; one lane per member of a node)."""
    out = []
    for lane in range(len(groups[0])):
        for side in (0, 1):
            chains = _chains(groups, lane, side)                       # head first
            i, p = next((i, c.index(rank)) for i, c in enumerate(chains) if rank in c)
            chain = chains[i]
            ups = [chain[p + 1]] if p + 1 < len(chain) else []
            up_to = chain[p - 1] if p > 0 else -1
            if p == 0:                                            # a head: the node tree
                ups += [chains[k][0] for k in (2 * i + 1, 2 * i + 2) if k < len(chains)]
                up_to = chains[(i - 1) // 2][0] if i > 0 else -1
            out.append(TreeRole(tuple(ups), up_to, 2 * lane + side))
    return out


def tree_all_reduce(tc: TimedComm, call: Call, reduce_s: Reduction, groups: list[list[int]],
                    flat: np.ndarray | None, buf: np.ndarray | None, n: int, itemsize: float,
                    t0: SimTime, depth: int) -> SimTime:
    """Sum n elements over the group by the trees of every lane in `depth` segments each, as
    messages of `call`; returns when this rank holds the whole result (`buf`, numerics
    on)."""
    parts = chunk_bounds(n, 2 * len(groups[0]))
    if buf is not None and flat is not None:
        buf[:] = flat                                 # sums accumulate in place
    ends: list[SimTime] = []
    sreqs: list[MPI.Request] = []
    segs = [(role, chunk_bounds(parts[role.tree][1] - parts[role.tree][0], depth,
                                parts[role.tree][0])) for role in roles(groups, tc.rank)]
    # segment-major: the lanes run side by side (NCCL's channels), and this rank's
    # reductions and sends are issued in the order their data can arrive
    plans = [(role, b[s]) for s in range(depth) for role, b in segs]
    ready: list[SimTime] = []
    for role, (lo, hi) in plans:                      # every segment climbs first ...
        ready.append(_up(tc, call, reduce_s, role, buf, lo, hi, itemsize, t0, sreqs))
    for (role, (lo, hi)), t in zip(plans, ready):     # ... then comes back down
        ends.append(_down(tc, call, role, buf, lo, hi, itemsize, t, sreqs))
    wait_all(sreqs)
    return max(ends, default=t0)


def _up(tc: TimedComm, call: Call, reduce_s: Reduction, role: TreeRole,
        buf: np.ndarray | None, lo: int, hi: int, itemsize: float, t0: SimTime,
        sreqs: list[MPI.Request]) -> SimTime:
    """Add the children's partial sums of [lo, hi) to ours and send the sum to the parent."""
    nbytes = (hi - lo) * itemsize
    t = t0
    for src in role.up_from:
        tmp = None if buf is None else np.empty(hi - lo, buf.dtype)
        h: RecvHandle = tc.irecv(tmp, src, TAG_TREE + 2 * role.tree, t0)
        t_arrive = h.wait()
        red = reduce_s(hi - lo, itemsize)
        t = tc.tl.reserve("tree.reduce", [f"{tc.stream}.{role.tree}"], red, max(t, t_arrive),
                          cat="comm",
                          flops=hi - lo, dram_bytes=3 * nbytes,
                          peer=tc.devices[src]).t_end
        if buf is not None and tmp is not None:
            np.add(buf[lo:hi], tmp, out=buf[lo:hi])
    if role.up_to >= 0:
        sh = tc.isend(None if buf is None else buf[lo:hi], role.up_to, TAG_TREE + 2 * role.tree,
                      nbytes, t, call, label="tree.up")
        sreqs += sh.reqs
    return t


def _down(tc: TimedComm, call: Call, role: TreeRole, buf: np.ndarray | None, lo: int,
          hi: int, itemsize: float, t: SimTime, sreqs: list[MPI.Request]) -> SimTime:
    """Receive the whole sum of [lo, hi) from the parent (the root has it) and pass it on."""
    nbytes = (hi - lo) * itemsize
    if role.down_from >= 0:
        h = tc.irecv(None if buf is None else buf[lo:hi], role.down_from,
                     TAG_TREE + 2 * role.tree + 1, t)
        t = h.wait()
    for dst in role.down_to:
        sh = tc.isend(None if buf is None else buf[lo:hi], dst, TAG_TREE + 2 * role.tree + 1,
                      nbytes, t, call, label="tree.down")
        sreqs += sh.reqs
    return t

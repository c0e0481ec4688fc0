"""NCCL's NVLS-Tree all-reduce across NVSwitch nodes: the switch reduces inside each node,
a tree joins the nodes on every rail, the switch multicasts the result back.

NCCL 2.18+ runs it for large all-reduces across H100 nodes when NVLS is on (tuning.cc:
NVLS_TREE, algBw = min(bwIntra, bwInter) x 5/6 on two nodes, hwLat[NVLINK][NVLS_TREE] =
25 us, hwLat[NET][NVLS_TREE] = 14 us; docs/nccl_model.md 1.2, 1.4). With G devices per
node, on `pipeline_depth` segments of each device's shard (1/G of the buffer):

1. reduce-scatter through the switch (multimem ld_reduce): the device's egress port carries
   its whole segment to the switch, its ingress the reduced shard segment (1/G of it); the
   shard is summed once every member's data is in (the members exchange their times);
2. the shard segment's all-reduce across nodes on the device's rail: NCCL's double binary
   tree (`tree.tree_all_reduce`, one device per node) through the device's own NIC, at the
   network's per-hop latency;
3. all-gather through the switch (multimem st): egress the shard segment, ingress every
   member's, once every member's rail result is in.

Both ports carry S (G+1)/G in all, as in one node's NVLS (`net.message.switch_reduce`),
at the port rate x the NVLS efficiency. The payload is real: MPI's Reduce_scatter and
Allgatherv stand for the switch's arithmetic and multicast, the rail trees move the shards.
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ..net.message import switch_transfer
from ..sim.timeline import SimTime
from .p2p import Call, TimedComm
from .ring import Reduction
from .lanes import chunk_bounds
from .tree import tree_all_reduce


def _latest(comm: MPI.Comm, times: list[SimTime]) -> list[SimTime]:
    """Each time's maximum over the node (one exchange for every segment)."""
    out = np.array(times, dtype=float)
    comm.Allreduce(MPI.IN_PLACE, out, op=MPI.MAX)
    return out.tolist()


def nvls_tree_all_reduce(tc: TimedComm, call: Call, reduce_s: Reduction,
                         flat: np.ndarray | None, buf: np.ndarray | None, n: int,
                         itemsize: float, t: SimTime, depth: int) -> SimTime:
    """Sum n elements over the group (whole nodes of one switch each) in `depth` segments;
    returns when this rank holds the whole result (`buf`, numerics on)."""
    node, rail = tc.hierarchy()
    on_rail = Call("simple", call.share, "ring")    # NET hop: NVLS_TREE's (hwLat[NET] of ring)
    g = node.size
    bounds = chunk_bounds(n, g)
    lo, hi = bounds[node.rank]
    shard = res = None
    if flat is not None:                             # the switch's sum, then the rails'
        shard = np.empty(hi - lo, flat.dtype)
        node.comm.Reduce_scatter(flat, shard, [b - a for a, b in bounds])
        res = np.empty_like(shard)
    segs = chunk_bounds(hi - lo, depth)
    t0 = _latest(node.comm, [t])[0]
    def switch(out: int, into: int, ready: SimTime, label: str) -> SimTime:
        return switch_transfer(tc.tl, tc.net, tc.device, out * itemsize, into * itemsize,
                               ready, label=label)
    rs = _latest(node.comm, [switch((b - a) * g, b - a, t0, "nvls_tree.rs") for a, b in segs])
    railed = [tree_all_reduce(rail, on_rail, reduce_s, [[r] for r in range(rail.size)],
                              None if shard is None else shard[a:b],
                              None if res is None else res[a:b], b - a, itemsize, t_rs, 1)
              for (a, b), t_rs in zip(segs, rs)]
    ready = _latest(node.comm, railed)
    end = max(switch(b - a, (b - a) * g, t_ag, "nvls_tree.ag")
              for (a, b), t_ag in zip(segs, ready))
    if buf is not None and res is not None:
        node.comm.Allgatherv(res, [buf, ([b - a for a, b in bounds], [a for a, _ in bounds])])
    return end

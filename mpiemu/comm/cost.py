"""Closed forms of the collectives' emulated time, and the (algorithm, protocol) choice.

The same arithmetic the emulation performs message by message, written out (tests check the
two agree to 1e-9 where the closed form is exact; `docs/network.md` derives each one):

* ring, one lane, N ranks, largest chunk c bytes, hop latency a, rate B (protocol's),
  reduction t_red(c):  RS = (a + c/B) + (N-2)(a + max(c/B, t_red)) + t_red,
  AG = (N-1)(a + c/B),  AR = RS + AG, plus the call's base latency (NCCL's baseLat);
* hierarchical all-reduce (G devices per node, n nodes): RS inside the node on S bytes,
  AR on the rail ring of n nodes on S/G bytes, AG inside the node; one base latency; on k
  pipelined segments (`collectives.pipeline_depth`) the estimate is the first segment's
  three phases plus k-1 times the busier of the NVLink share (RS + AG) and the NIC share
  (AR) of one segment (exact for k = 1);
* nvls all-reduce (one NVSwitch node, N devices): base(nvls) + S (N+1)/N / (B e_nvls), both
  port directions busy at once (`net.message.switch_reduce`);
* all-to-all (`comm.all_to_all`, b bytes to each of the N-1 peers): base + the busiest of
  this rank's ports (its egress and NICs, the ingress its peers' messages reserve) at the
  Simple rate + the longest hop latency; exact where those ports carry nothing else (one
  switch node: base + (N-1) b / B + a).

A ring whose lanes share ports (bidirectional on a switch, several rails across nodes) is
estimated by its most loaded port per step.
`choose` picks what NCCL's tuner would among what the network and group allow and NCCL has
(`comm.tuner`: NCCL's own cost model, not these estimates; the hierarchical form is not
NCCL's: it runs only when asked); `collectives.algorithm` / `protocol` override it.
"""
from __future__ import annotations

import math
from typing import Sequence

from ..net.topology import Hop
from .folded import FoldedComm
from .p2p import TimedComm
from .ring import Reduction, ring_orders
from .tuner import Choice, allowed_on, candidates, node_groups, pick

OPS = ("reduce_scatter", "all_gather", "all_reduce")
P2P_ALGORITHM = "p2p"       # NCCL's send / receive (all-to-all): no tuner choice, Simple
ASKED_ONLY = ("hierarchical",)  # run when `collectives.algorithm` names it, never chosen:
                                # NCCL has no such algorithm (docs/nccl_model.md 1, 2.2)

PIPELINE_STEPS = 8          # NCCL src/include/device.h NCCL_STEPS: slots a channel pipelines
PIPELINE_MIN_BYTES = 1 << 20  # ASSUMPTION: no segment of the hierarchical form below 1 MiB


def pipeline_depth(nbytes: float) -> int:
    """Segments the hierarchical all-reduce pipelines (1 below 2 MiB, at most 8)."""
    return int(min(PIPELINE_STEPS, max(1, nbytes // PIPELINE_MIN_BYTES)))


def ring_steps_s(n: int, chunk_bytes: float, rate: float, lat: float, red_s: float,
                 op: str) -> float:
    """One-lane ring without the base latency (formulas above)."""
    if n <= 1:
        return 0.0
    w = chunk_bytes / rate
    rs = (lat + w) + (n - 2) * (lat + max(w, red_s)) + red_s
    ag = (n - 1) * (lat + w)
    return {"reduce_scatter": rs, "all_gather": ag, "all_reduce": rs + ag}[op]


def view(tc: TimedComm, ranks: Sequence[int]) -> TimedComm:
    """The sub-group of these ranks of tc, for estimates only (it sends nothing)."""
    devices = [tc.devices[r] for r in ranks]
    return TimedComm(FoldedComm.images(tc.name, devices.index(tc.device), devices),
                     tc.tl, tc.net, tc.name)


def hierarchy_views(tc: TimedComm) -> tuple[TimedComm, TimedComm]:
    """This rank's node group and its rail across nodes (the hierarchical all-reduce's
    `node` and `rail` splits), as views."""
    groups = node_groups(tc.net, tc.devices)
    mine = next(g for g in groups if tc.rank in g)
    return view(tc, mine), view(tc, [g[mine.index(tc.rank)] for g in groups])


def allowed(tc: TimedComm, op: str) -> list[str]:
    """Algorithms this group and network can run for `op`."""
    return allowed_on(tc.net, tc.devices, op)


def ring_hops(tc: TimedComm, bidirectional: bool) -> tuple[list[Hop], int]:
    """Every hop of the ring's lanes, lane by lane in ring order, and the distinct ports the
    lanes leave this rank's group through (remembered per group: a world ring of thousands
    of emulated devices is walked once, not once per candidate protocol)."""
    key = ("ring_hops", bidirectional)
    got = tc.memo.get(key)
    if got is None:
        n, orders = tc.size, ring_orders(tc, bidirectional)
        hops = [tc.net.hop(tc.devices[a], tc.devices[o[(i + 1) % n]])
                for o in orders for i, a in enumerate(o)]
        ports = len({hops[j * n].egress for j in range(len(orders))})
        got = tc.memo[key] = (hops, ports)
    return got


def ring_estimate_s(tc: TimedComm, op: str, nbytes: float, itemsize: float, proto: str,
                    reduce_s: Reduction, bidirectional: bool = False,
                    share: float | None = None) -> float:
    """Ring time without the base latency: exact for one lane whose ports carry nothing
    else, else an estimate from the most loaded port's busy time per step."""
    n = tc.size
    if n == 1:
        return 0.0
    hops, ports = ring_hops(tc, bidirectional)
    n_lanes = len(hops) // n
    if share is None:           # the channels NCCL gives a call of this size
        share = tc.net.spec.channel_share(proto, nbytes, tc.size)
    elems = nbytes / itemsize
    c = math.ceil(math.ceil(elems / n) / n_lanes) * itemsize
    red = reduce_s(math.ceil(math.ceil(elems / n) / n_lanes), itemsize)
    load: dict[str, float] = {}
    lat = 0.0
    cost: dict[tuple[int, int], tuple[float, float]] = {}    # per (transport, hops)
    for hop in hops:
        k = (id(hop.transport), hop.hops)
        if k not in cost:
            cost[k] = (c / tc.net.rate(hop, proto, share), tc.net.latency(hop, proto))
        w, a = cost[k]
        load[hop.egress] = load.get(hop.egress, 0.0) + w
        if hop.ingress is not None:
            load[hop.ingress] = load.get(hop.ingress, 0.0) + w
        lat = max(lat, a)
    return ring_steps_s(n, max(load.values(), default=0.0), 1.0, lat, red * ports, op)


def tree_depth(nbytes: float, lanes: int) -> int:
    """Segments each tree of a call pipelines (`pipeline_depth` of one tree's share)."""
    return pipeline_depth(nbytes / (2 * lanes))


def _node_tree(tc: TimedComm) -> tuple[list[list[int]], Hop, int, int]:
    """What both tree estimates take of the nodes: the call's ranks by node, the hop between
    two nodes' heads, the node tree's levels below its root, and the segments a head's NIC
    carries each way per round (two once the tree has interior nodes, one on two nodes)."""
    groups = node_groups(tc.net, tc.devices)
    nodes = len(groups)
    inter = tc.net.hop(tc.devices[groups[0][0]], tc.devices[groups[1][0]])
    return groups, inter, max(1, math.ceil(math.log2(nodes + 1)) - 1), 2 if nodes > 2 else 1


def tree_estimate_s(tc: TimedComm, nbytes: float, itemsize: float, proto: str,
                    reduce_s: Reduction) -> float:
    """G lanes (one per rail) of two trees, 1/(2G) of the data each, k segments: one
    segment's climb and descent (chain hops inside the node, tree hops between nodes, a
    reduction per level) plus k-1 times the busiest port's share of a round of segments
    (every NIC heads two trees; a device sends up and down in the chains it is interior to).
    Exact for one device per node, two nodes and k = 1: 2 (h/B + a) + t_red(h), h = S/2."""
    groups, inter, depth, nic_load = _node_tree(tc)
    g = len(groups[0])
    k = tree_depth(nbytes, g)
    seg = nbytes / (2 * g) / k
    share = tc.net.spec.channel_share(proto, nbytes, tc.size)
    r_ib, a_ib = tc.net.rate(inter, proto, share), tc.net.latency(inter, proto, "tree")
    red = reduce_s(math.ceil(seg / itemsize), itemsize)
    climb = depth * (seg / r_ib + a_ib + red)
    busiest = nic_load * seg / r_ib
    if g > 1:
        intra = tc.net.hop(tc.devices[groups[0][0]], tc.devices[groups[0][1]])
        r_nv, a_nv = tc.net.rate(intra, proto, share), tc.net.latency(intra, proto, "tree")
        climb += (g - 1) * (seg / r_nv + a_nv + red)
        busiest = max(2 * busiest, (4 * g - 4) * seg / r_nv)
    levels = depth + (g - 1)                     # one reduction per level, climbing only
    return 2 * climb - levels * red + (k - 1) * busiest


def nvls_tree_estimate_s(tc: TimedComm, nbytes: float, itemsize: float,
                         reduce_s: Reduction) -> float:
    """k segments of the G shards: one segment through the switch (its whole data out),
    the rail's tree on its shard, back through the switch (the whole result in), plus k-1
    times the busier of a port (a segment's (G+1)/G) and the NIC (the rail tree's load).
    Exact for k = 1 and two nodes: 2 S / B' + 2 (h/(2 B) + a) + t_red(h/2), h = S / G."""
    groups, inter, depth, nic_load = _node_tree(tc)
    g = len(groups[0])
    k = nvls_tree_depth(nbytes, g)
    seg = nbytes / g / k                                       # a shard's segment, bytes
    spec = tc.net.spec
    b_sw = spec.intra.bw_bytes_per_s * spec.nvls_efficiency
    share = spec.channel_share("simple", nbytes, tc.size)     # as the call's rail runs
    r_ib, a_ib = tc.net.rate(inter, "simple", share), tc.net.latency(inter, "simple")
    red = reduce_s(math.ceil(seg / 2 / itemsize), itemsize)
    rail = 2 * depth * (seg / 2 / r_ib + a_ib) + depth * red
    busiest = max(seg * (g + 1) / b_sw, nic_load * seg / r_ib)
    return 2 * seg * g / b_sw + rail + (k - 1) * busiest


def nvls_tree_depth(nbytes: float, g: int) -> int:
    """Segments each device's shard pipelines (`pipeline_depth` of the shard)."""
    return pipeline_depth(nbytes / g)


def p2p_share(tc: TimedComm, wire_bytes: float) -> float:
    """The channel share of a point-to-point call (an all-to-all) whose messages carry
    `wire_bytes` in all: the share NCCL gives a collective of that size (Simple), the
    port's whole rate for a large call (`comm.all_to_all` says why)."""
    return tc.net.spec.channel_share("simple", wire_bytes, tc.size)


def all_to_all_s(tc: TimedComm, peer_bytes: float) -> float:
    """An all-to-all of `peer_bytes` to and from every peer (`comm.all_to_all`), base latency
    included: base + the most loaded of this rank's ports (each message's wire time on its
    sender's egress and its receiver's ingress) + the longest hop latency. Exact on one
    switch node (base + (N-1) b / B + a); the busiest port's estimate otherwise."""
    n = tc.size
    if n <= 1:
        return 0.0
    net, me = tc.net, tc.device
    share = p2p_share(tc, peer_bytes * (n - 1))
    load: dict[str, float] = {}
    lat = 0.0
    for j, d in enumerate(tc.devices):
        if j == tc.rank:
            continue
        out, back = net.hop(me, d), net.hop(d, me)
        w = peer_bytes / net.rate(out, "simple", share) if peer_bytes > 0 else 0.0
        load[out.egress] = load.get(out.egress, 0.0) + w
        if back.ingress is not None:
            w_in = peer_bytes / net.rate(back, "simple", share) if peer_bytes > 0 else 0.0
            load[back.ingress] = load.get(back.ingress, 0.0) + w_in
        lat = max(lat, net.latency(out, "simple", P2P_ALGORITHM))
    return tc.net.spec.base(P2P_ALGORITHM, "simple") + max(load.values()) + lat


def estimate_s(tc: TimedComm, op: str, nbytes: float, itemsize: float, ch: Choice,
               reduce_s: Reduction, bidirectional: bool = False) -> float:
    """The predicted time of one call (base latency included; `reduce_s`: the device's;
    an all-to-all's nbytes is a rank's whole send buffer, nbytes / N to each rank)."""
    if op == "all_to_all":
        return all_to_all_s(tc, nbytes / tc.size)
    base = tc.net.spec.base(ch.algorithm, ch.protocol)
    if ch.algorithm == "ring":
        return base + ring_estimate_s(tc, op, nbytes, itemsize, ch.protocol, reduce_s,
                                      bidirectional)
    if ch.algorithm == "nvls":
        n, spec = tc.size, tc.net.spec
        return base + nbytes * (n + 1) / n / (spec.intra.bw_bytes_per_s * spec.nvls_efficiency)
    if ch.algorithm == "tree":
        return base + tree_estimate_s(tc, nbytes, itemsize, ch.protocol, reduce_s)
    if ch.algorithm == "nvls_tree":
        return base + nvls_tree_estimate_s(tc, nbytes, itemsize, reduce_s)
    intra, rail = hierarchy_views(tc)
    k = pipeline_depth(nbytes)
    seg = nbytes / k
    share = tc.net.spec.channel_share(ch.protocol, nbytes, tc.size)
    s_rs = ring_estimate_s(intra, "reduce_scatter", seg, itemsize, ch.protocol, reduce_s,
                           share=share)
    s_ar = ring_estimate_s(rail, "all_reduce", seg / intra.size, itemsize, ch.protocol,
                           reduce_s, share=share)
    s_ag = ring_estimate_s(intra, "all_gather", seg, itemsize, ch.protocol, reduce_s,
                           share=share)
    return base + s_rs + s_ar + s_ag + (k - 1) * max(s_rs + s_ag, s_ar)


def choose(tc: TimedComm, op: str, nbytes: float, itemsize: float, algorithm: str = "",
           protocol: str = "", bidirectional: bool = False) -> Choice:
    """The lowest predicted (algorithm, protocol), within what is asked for (remembered
    per group and call shape: the estimates depend on nothing else)."""
    key = ("choose", op, nbytes, itemsize, algorithm, protocol, bidirectional)
    got = tc.memo.get(key)
    if got is None:
        got = tc.memo[key] = _choose(tc, op, nbytes, itemsize, algorithm, protocol,
                                     bidirectional)
    return got


def _choose(tc: TimedComm, op: str, nbytes: float, itemsize: float, algorithm: str,
            protocol: str, bidirectional: bool) -> Choice:
    algos = allowed(tc, op)
    if algorithm:
        if algorithm not in algos:
            raise ValueError(f"collectives.algorithm={algorithm!r} cannot run {op} on this "
                             f"group and network; allowed here: {algos}")
        algos = [algorithm]
    else:                       # NCCL's tuner has no hierarchical ring (tuning.cc's algorithms:
        algos = [a for a in algos if a not in ASKED_ONLY]   # tree, ring, collnet, nvls)
    protos = tc.net.spec.protocols
    if protocol:
        if protocol not in protos:
            raise ValueError(f"collectives.protocol={protocol!r} is not a protocol of network "
                             f"{tc.net.spec.name}; it has {list(protos)}")
        protos = (protocol,)
    cands = candidates(algos, protos)
    if not cands:
        raise ValueError(f"collectives.protocol={protocol!r}: nvls and nvls_tree run the "
                         "simple protocol only")
    if len(cands) == 1:
        return cands[0]
    return pick(tc.net.spec, op, nbytes, tc.size, len(node_groups(tc.net, tc.devices)), cands,
                bidirectional)

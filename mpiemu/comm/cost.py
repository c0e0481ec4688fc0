"""Closed forms of the collectives' emulated time, and the (algorithm, protocol) choice.

The same arithmetic the emulation performs message by message, written out (tests check the
two agree to 1e-9 where the closed form is exact; `docs/network.md` derives each one):

* ring, one lane, N ranks, largest chunk c bytes, hop latency a, rate B (protocol's),
  reduction t_red(c):  RS = (a + c/B) + (N-2)(a + max(c/B, t_red)) + t_red,
  AG = (N-1)(a + c/B),  AR = RS + AG, plus the call's base latency (NCCL's baseLat);
* hierarchical all-reduce (G devices per node, n nodes): RS inside the node on S bytes,
  AR on the rail ring of n nodes on S/G bytes, AG inside the node; one base latency.

A ring whose lanes share ports (bidirectional on a switch, several rails across nodes) is
estimated by its most loaded port per step; that estimate serves the choice only.
`choose` picks the lowest estimate among what the network and group allow, as NCCL's
tuner does (`docs/nccl_model.md`); `collectives.algorithm` / `protocol` override it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .p2p import TimedComm

OPS = ("reduce_scatter", "all_gather", "all_reduce")


@dataclass(frozen=True)
class Choice:
    """An algorithm and protocol for one collective call."""

    algorithm: str
    protocol: str


def ring_steps_s(n: int, chunk_bytes: float, rate: float, lat: float, red_s: float,
                 op: str) -> float:
    """One-lane ring without the base latency (formulas above)."""
    if n <= 1:
        return 0.0
    w = chunk_bytes / rate
    rs = (lat + w) + (n - 2) * (lat + max(w, red_s)) + red_s
    ag = (n - 1) * (lat + w)
    return {"reduce_scatter": rs, "all_gather": ag, "all_reduce": rs + ag}[op]


def node_groups(tc: TimedComm) -> list[list[int]]:
    """Ranks of the communicator grouped by node, in rank order."""
    by: dict[int, list[int]] = {}
    for r, d in enumerate(tc.devices):
        by.setdefault(tc.net.node_of(d), []).append(r)
    return list(by.values())


def allowed(tc: TimedComm, op: str) -> list[str]:
    """Algorithms this group and network can run for `op`."""
    out = ["ring"]
    if op != "all_reduce":
        return out
    groups = node_groups(tc)
    k = len(groups[0])
    if len(groups) > 1 and k > 1 and all(len(g) == k for g in groups):
        out.append("hierarchical")
    return out


def ring_estimate_s(tc: TimedComm, op: str, nbytes: float, itemsize: int, proto: str,
                    bidirectional: bool = False) -> float:
    """Ring time without the base latency: exact for one lane whose ports carry nothing
    else, else an estimate from the most loaded port's busy time per step."""
    from .ring import ring_orders         # the lanes the engine will run
    n = tc.size
    if n == 1:
        return 0.0
    orders = ring_orders(tc, bidirectional)
    n_lanes = len(orders)
    elems = nbytes / itemsize
    c = math.ceil(math.ceil(elems / n) / n_lanes) * itemsize
    red = tc.model.reduction_s(math.ceil(math.ceil(elems / n) / n_lanes), itemsize)
    load: dict[str, float] = {}
    lat = 0.0
    for o in orders:
        for i, a in enumerate(o):
            b = o[(i + 1) % n]
            hop = tc.net.hop(tc.devices[a], tc.devices[b])
            rate = tc.net.rate(hop, proto)
            for port in (hop.egress, hop.ingress):
                if port is not None:
                    load[port] = load.get(port, 0.0) + c / rate
            lat = max(lat, tc.net.latency(hop, proto))
    return ring_steps_s(n, max(load.values(), default=0.0), 1.0, lat, red * n_lanes, op)


def estimate_s(tc: TimedComm, op: str, nbytes: float, itemsize: int, ch: Choice,
               bidirectional: bool = False) -> float:
    """The predicted time of one call (base latency included)."""
    base = tc.net.spec.base(ch.protocol)
    if ch.algorithm == "ring":
        return base + ring_estimate_s(tc, op, nbytes, itemsize, ch.protocol, bidirectional)
    intra = tc.split("node", tc.net.node_of(tc.device))
    rail = tc.split("rail", intra.rank)
    s_intra = ring_estimate_s(intra, "reduce_scatter", nbytes, itemsize, ch.protocol)
    s_rail = ring_estimate_s(rail, "all_reduce", nbytes / intra.size, itemsize, ch.protocol)
    s_ag = ring_estimate_s(intra, "all_gather", nbytes, itemsize, ch.protocol)
    return base + s_intra + s_rail + s_ag


def choose(tc: TimedComm, op: str, nbytes: float, itemsize: int, algorithm: str = "",
           protocol: str = "", bidirectional: bool = False) -> Choice:
    """The lowest predicted (algorithm, protocol), within what is asked for."""
    algos = allowed(tc, op)
    if algorithm:
        if algorithm not in algos:
            raise ValueError(f"collectives.algorithm={algorithm!r} cannot run {op} on this "
                             f"group and network; allowed here: {algos}")
        algos = [algorithm]
    protos = tc.net.spec.protocols
    if protocol:
        if protocol not in protos:
            raise ValueError(f"collectives.protocol={protocol!r} is not a protocol of network "
                             f"{tc.net.spec.name}; it has {list(protos)}")
        protos = (protocol,)
    cands = [Choice(a, p) for a in algos for p in protos]
    return min(cands, key=lambda ch: estimate_s(tc, op, nbytes, itemsize, ch, bidirectional))

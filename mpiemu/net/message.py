"""The one message path: when a message leaves, what it occupies, when it arrives (no MPI).

Every message of the emulator (ring steps of TP, SP and DP collectives, fused T3 pieces,
point-to-point sends) is timed here, from the route the network gives it:

* the sender reserves its egress port for the wire time (bytes / rate of the protocol on
  that hop, or longer when the sender cannot feed it faster: a reduction streamed into the
  send, DRAM shared with a GEMM) from when the data is ready (`sim.calendar`: gaps filled in
  issue order);
* the receiver reserves its ingress port for the same wire time, from the send's start;
* the message arrives one hop latency (per protocol) after the later of the two ends.

The trace records each message twice, under its route (`Hop.label`, e.g.
`port.0.out>port.3.in`, `nic.3.out>nic.11.in`): on the sender from its start to the end of
its egress reservation (the port is busy throughout: gaps inside went to earlier flows, so
`export --chrome` derives each port's utilisation from these events), and on the receiver,
as `in:<route>`, from its start to its arrival (what the receiver waited for).

The header that travels in front of the payload carries what the receiver needs:
`[t_start, t_egress_end, wire_s, latency_s, nbytes]`.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..sim.timeline import SimTime, Timeline
from .topology import Network

HEADER_LEN = 5
Feed = Callable[[SimTime], SimTime]      # start -> the least wire time the sender can feed


def send(tl: Timeline, net: Network, src: int, dst: int, nbytes: float, ready: SimTime,
         proto: str, *, label: str, peer: int, stage: int = -1, dram_bytes: float = 0.0,
         feed: Feed | None = None, share: float = 1.0, algorithm: str = "ring"
         ) -> np.ndarray:
    """Place a message on the sender's port and record it; returns its header."""
    hop = net.hop(src, dst)
    wire = nbytes / net.rate(hop, proto, share) if nbytes > 0 else 0.0
    start = ready                   # occupy starts at the port's first idle instant anyway
    if feed is not None:            # ... but the feed depends on it
        start = tl.port_idle(hop.egress, ready)
        wire = max(wire, feed(start))
    t0, t_out = tl.occupy(hop.egress, start, wire)
    lat = net.latency(hop, proto, algorithm)
    tl.record(label, "comm", hop.label, t0, t_out, 0.0, int(nbytes), dram_bytes,
              peer, stage, None)
    return np.array([t0, t_out, wire, lat, float(nbytes)])


def arrival(tl: Timeline, net: Network, src: int, dst: int, header: np.ndarray, *,
            peer: int = -1, label: str = "recv") -> SimTime:
    """When a message with this header is in the receiver's memory (ingress reserved)."""
    t0, t_out, wire, lat, nbytes = header[:5].tolist()      # Python floats, as float()
    hop = net.hop(src, dst)
    t_in = t_out
    if hop.ingress is not None:
        t_in = max(t_out, tl.occupy(hop.ingress, t0, wire)[1])
    tl.record(label, "comm", hop.in_label, t0, t_in + lat, 0.0, int(nbytes), 0.0, peer,
              -1, None)
    return t_in + lat


def switch_reduce(tl: Timeline, net: Network, device: int, nbytes: float, ready: SimTime,
                  *, label: str) -> SimTime:
    """One device's share of an in-switch all-reduce (NVLink SHARP) of nbytes: the switch
    reads every chunk from every device and multicasts each reduced chunk back, so both of
    the device's ports carry nbytes (N+1)/N, pipelined (both directions at once); returns
    when the device holds the result."""
    both = nbytes * (net.per_node + 1) / net.per_node
    return switch_transfer(tl, net, device, both, both, ready, label=label, nbytes=nbytes)


def switch_transfer(tl: Timeline, net: Network, device: int, out_bytes: float,
                    in_bytes: float, ready: SimTime, *, label: str,
                    nbytes: float | None = None) -> SimTime:
    """A device's egress and ingress ports busy from `ready` with these bytes to and from
    the switch's reduction / multicast engine, at the port rate x the NVLS efficiency;
    returns when both are done (the trace records `nbytes`, default what leaves)."""
    node, a = net.node_of(device), net.local(device)
    peer = net.member(node, a + 1 if a + 1 < net.per_node else a - 1)
    out, back = net.hop(device, peer), net.hop(peer, device)     # this device's two ports
    assert back.ingress is not None                     # a switch: checked by the caller
    rate = out.transport.bw_bytes_per_s * net.spec.nvls_efficiency
    t0, t_out = tl.occupy(out.egress, ready, out_bytes / rate)
    _, t_in = tl.occupy(back.ingress, ready, in_bytes / rate)
    tl.record(label, "comm", f"{out.egress}>switch>{back.ingress}", t0, max(t_out, t_in), 0.0,
              int(out_bytes if nbytes is None else nbytes), 0.0, -1, -1, None)
    return max(t_out, t_in)

"""Where a message goes: nodes, ports and routes of a job's emulated devices.

Device d is world rank d. Ranks fill nodes in order (node = d // devices_per_node), as
`srun --distribution=block` and `mpiexec` place them; `network.devices_per_node` sets the
size. A `placement` (the node of each device) replaces that rule: a job that really spans
several hosts is emulated on its real placement (`runner.context`), e.g. `srun
--distribution=cyclic`. Inside a node the fabric is

* `switch` (NVSwitch, a PCIe switch): each device has one egress port `port.<d>.out` and one
  ingress port `port.<d>.in`, shared by every destination and every communicator;
* `fully-connected` (Infinity Fabric, NVLink meshes): one link per ordered pair,
  `link.<a>><b>`, used by that pair alone;
* `ring` (the T3 study's GPUs): links to the two neighbours only, `link.<a>><b>`; a message
  to a device further away leaves on the first link of the shorter arc and pays one
  latency per hop (the links it crosses further on are not reserved: stated in
  docs/network.md).

Between nodes (topology `hierarchical`) every device has its own NIC (rail-optimised: one
NIC per GPU, as DGX nodes are built), `nic.<d>.out` and `nic.<d>.in`; the fabric behind the
NICs is non-blocking (a rail-optimised fat tree), so only the NICs are shared resources.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .spec import NetworkSpec, Transport


@dataclass(frozen=True)
class Hop:
    """The resources one message occupies and what it costs per byte and per hop."""

    egress: str               # port the sender reserves
    ingress: str | None       # port the receiver reserves (None: a link of this pair alone)
    transport: Transport
    inter_node: bool
    hops: int = 1             # latencies paid (a ring fabric's multi-hop path)
    # the route as a trace records it: `port.0.out>port.1.in`, `nic.3.out>nic.11.in`; and
    # on the receiver, `in:` + the route (made once: routes are cached per device pair)
    label: str = field(init=False, compare=False, repr=False)
    in_label: str = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        label = self.egress if self.ingress is None else f"{self.egress}>{self.ingress}"
        object.__setattr__(self, "label", label)
        object.__setattr__(self, "in_label", f"in:{label}")


@dataclass(frozen=True)
class Network:
    """A job's network: the spec, the number of devices and where each one sits."""

    spec: NetworkSpec
    size: int
    placement: tuple[int, ...] = ()     # node of each device; () = block placement
    _hops: dict[tuple[int, int], Hop] = field(default_factory=dict, compare=False, repr=False)
    _members: dict[int, list[int]] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.placement:
            self._place()
            return
        g = self.spec.devices_per_node
        if g and self.size > g and self.size % g:
            raise ValueError(f"network.devices_per_node={g} does not divide the job's "
                             f"{self.size} ranks; choose a divisor of {self.size}")
        if self.nodes > 1 and self.spec.topology != "hierarchical":
            raise ValueError(f"network.topology={self.spec.topology!r} is one node of "
                             f"{self.per_node} devices but the job has {self.size} ranks; use "
                             "'hierarchical' (nodes joined by a network) or raise "
                             "network.devices_per_node")

    def _place(self) -> None:
        """Nodes from an explicit placement: equal device counts, a hierarchical network."""
        if len(self.placement) != self.size:
            raise ValueError(f"placement names {len(self.placement)} devices for a job of "
                             f"{self.size}")
        for d, node in enumerate(self.placement):
            self._members.setdefault(node, []).append(d)
        counts = {len(m) for m in self._members.values()}
        if len(counts) > 1:
            raise ValueError(f"the hosts hold {sorted(counts)} ranks each; the emulated "
                             "network needs the same number of ranks on every node")
        if self.nodes > 1 and self.spec.topology != "hierarchical":
            raise ValueError(f"network.topology={self.spec.topology!r} is one node but the "
                             f"job runs on {self.nodes} hosts; use 'hierarchical'")

    @property
    def per_node(self) -> int:
        """Devices in one node (the job's ranks when it fills less than one node)."""
        if self.placement:
            return self.size // len(self._members)
        g = self.spec.devices_per_node
        return min(g, self.size) if g else self.size

    @property
    def nodes(self) -> int:
        return -(-self.size // self.per_node)

    def node_of(self, device: int) -> int:
        return self.placement[device] if self.placement else device // self.per_node

    def local(self, device: int) -> int:
        """Position of a device inside its node."""
        if self.placement:
            return self._members[self.placement[device]].index(device)
        return device % self.per_node

    def member(self, node: int, local: int) -> int:
        """The device at position `local` of node `node`."""
        if self.placement:
            return self._members[node][local]
        return node * self.per_node + local

    def hop(self, src: int, dst: int) -> Hop:
        """The route of a message from device src to device dst (cached per pair)."""
        key = (src, dst)
        hop = self._hops.get(key)
        if hop is None:
            hop = self._hops[key] = self._route(src, dst)
        return hop

    def route_class(self, src: int, dst: int) -> tuple[bool, int]:
        """What makes two routes alike without naming their ports: whether it crosses
        nodes, and its NVLink hops (a ring fabric's shorter way round; else 1)."""
        if self.node_of(src) != self.node_of(dst):
            return True, 1
        if self.spec.fabric != "ring":
            return False, 1
        g = self.per_node
        fwd = (self.local(dst) - self.local(src)) % g
        return False, min(fwd, g - fwd)

    def _route(self, src: int, dst: int) -> Hop:
        if src == dst:
            raise ValueError(f"device {src} sends to itself")
        if self.node_of(src) != self.node_of(dst):
            inter = self.spec.inter
            assert inter is not None              # checked: hierarchical has [inter]
            return Hop(f"nic.{src}.out", f"nic.{dst}.in", inter, True)
        intra, fabric = self.spec.intra, self.spec.fabric
        if fabric == "switch":
            return Hop(f"port.{src}.out", f"port.{dst}.in", intra, False)
        if fabric == "fully-connected":
            return Hop(f"link.{src}>{dst}", None, intra, False)
        g, a, b = self.per_node, self.local(src), self.local(dst)
        fwd = (b - a) % g
        step = 1 if fwd <= g - fwd else -1
        first = self.member(self.node_of(src), (a + step) % g)
        return Hop(f"link.{src}>{first}", None, intra, False, hops=min(fwd, g - fwd))

    def rate(self, hop: Hop, proto: str, share: float = 1.0) -> float:
        """Bytes/s a message of protocol `proto` moves on this hop (port rate x efficiency,
        capped by the protocol's ceiling) when its call drives `share` of the channels."""
        s = self.spec
        r = hop.transport.bw_bytes_per_s * s.efficiency[proto]
        cap = s.max_bw_bytes_per_s.get(proto)
        return (min(r, cap) if cap else r) * share

    def latency(self, hop: Hop, proto: str, algorithm: str = "ring") -> float:
        """A message's latency on this hop (per protocol, the tree's own where given)."""
        return (hop.transport.latency(proto, algorithm) * hop.hops
                * self.spec.hop_scale(proto))

    def spans_nodes(self, devices: list[int]) -> bool:
        return len({self.node_of(d) for d in devices}) > 1

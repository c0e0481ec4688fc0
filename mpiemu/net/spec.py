"""What a network is made of: transports, protocols, topology (frozen, SI units in names).

A network preset (`net/presets/*.toml`, every number with its source) becomes a
`NetworkSpec` through the same generic capability walk as device presets (`devices.caps`), so
`--set network.<path>=VALUE` and `network.scale.bw` work for every field.

Terms (NCCL's, `docs/network.md`): a *transport* is a kind of hop (NVLink through NVSwitch,
an Infinity Fabric link, a NIC and the fabric behind it); its rate is the data a device's
port actually moves per direction (NCCL counts 20 GB/s per NVLink3 link, not the 25 GB/s
line rate). A *protocol* (LL, LL128, Simple) trades bandwidth for latency: a share of each
line carries flags, and each hop costs a per-protocol latency. An *algorithm* (ring,
hierarchical, nvls: NVLink SHARP, the switch reduces) arranges the messages of a collective;
each call pays a base latency.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from ..devices.caps import CapError, cap

PROTOCOLS = ("ll", "ll128", "simple")
ALGORITHMS = ("ring", "tree", "hierarchical", "nvls", "nvls_tree")
FABRICS = ("ring", "switch", "fully-connected")          # inside one node
TOPOLOGIES = (*FABRICS, "hierarchical")                  # hierarchical: nodes + a network
ALGO_PROTO = (*(f"{a}_{p}" for a in ("ring", "tree") for p in PROTOCOLS), "nvls_simple")


# NCCL v2.21.5-1: threads per channel (src/include/device.h:55-57,74) and the bytes each
# thread must have before a call uses more channels (src/include/comm.h:35-37; ring LL x the
# ranks, src/graph/tuning.cc:381); `NetworkSpec.channel_share` applies enqueue.cc:1590-1606.
NCCL_THREADS = {"ll": 512, "ll128": 640, "simple": 512}
NCCL_THREAD_THRESHOLD = {"ll": 8, "ll128": 8, "simple": 64}


@dataclass(frozen=True)
class NetScale:
    """What-if knob (thesis 5.3.3.6): every network rate multiplied by `bw`."""

    bw: float = 1.0

    def __post_init__(self) -> None:
        if not self.bw > 0:
            raise CapError("network.scale.bw", self.bw, "a factor > 0")


@dataclass(frozen=True)
class Transport:
    """One kind of hop: the data rate of a device's port per direction and, per protocol,
    the latency of one hop (NCCL's hwLat; a message pays it once, it does not occupy the
    port). On a `ring` or `fully-connected` fabric the port is one link to one peer."""

    bw_bytes_per_s: float = field(metadata=cap(scale="bw"))
    latency_s: Mapping[str, float] = field(metadata=cap(key="latency_{}", entries=PROTOCOLS))
    tree_latency_s: Mapping[str, float] = field(default_factory=dict, metadata=cap(
        key="tree_latency_{}", entries=PROTOCOLS))     # NCCL's hwLat of the tree, if given

    def __post_init__(self) -> None:
        if not self.bw_bytes_per_s > 0:
            raise ValueError(f"bw={self.bw_bytes_per_s} must be > 0 (bytes/s)")
        for p, v in (*self.latency_s.items(), *self.tree_latency_s.items()):
            if not v >= 0:
                raise ValueError(f"latency_{p}={v} must be >= 0 (seconds)")

    def latency(self, proto: str, algorithm: str = "ring") -> float:
        """One hop's latency for a protocol (the tree's own where the preset gives it)."""
        if algorithm == "tree" and proto in self.tree_latency_s:
            return self.tree_latency_s[proto]
        try:
            return self.latency_s[proto]
        except KeyError:
            raise ValueError(f"protocol {proto!r} has no hop latency on this transport; "
                             f"it has {sorted(self.latency_s)}") from None


@dataclass(frozen=True)
class NetworkSpec:
    """Devices in nodes, the fabric inside a node, the network between nodes, and the
    collective costs on top (base latency per protocol, protocol efficiency).

    `devices_per_node` = 0: every rank in one node. Ranks fill nodes in order (rank r on
    node r // devices_per_node), as `srun` block distribution and `mpiexec` place them.
    `call_latency_scale` multiplies each call's base latency (NCCL's baseLat: launch and
    setup) and `hop_latency_scale[p]` each hop's latency under protocol p (NCCL's hwLat; 1
    where not given): NCCL's tuning latencies are relative costs for choosing among
    algorithms, and measured calls take longer. These are the network layer's calibrated
    constants, fitted together on single-node data sets (results/collectives/README.md).
    """

    name: str
    topology: str
    intra: Transport = field(metadata=cap())
    base_latency_s: Mapping[str, float] = field(metadata=cap(
        section="collectives", key="base_{}", entries=ALGO_PROTO))
    efficiency: Mapping[str, float] = field(metadata=cap(
        section="collectives", key="efficiency_{}", entries=PROTOCOLS))
    max_bw_bytes_per_s: Mapping[str, float] = field(default_factory=dict, metadata=cap(
        section="collectives", key="max_bw_{}", entries=PROTOCOLS, scale="bw"))
    node_topology: str = "switch"
    devices_per_node: int = field(default=0, metadata=cap(section="node"))
    nvls_efficiency: float = field(default=0.0, metadata=cap(section="collectives"))
    channels: int = field(default=0, metadata=cap(section="collectives"))
    nvls_channels: int = field(default=0, metadata=cap(section="collectives"))
    call_latency_scale: float = field(default=1.0, metadata=cap(section="collectives"))
    hop_latency_scale: Mapping[str, float] = field(default_factory=dict, metadata=cap(
        section="collectives", key="hop_latency_scale_{}", entries=PROTOCOLS))
    inter: Transport | None = None
    scale: NetScale = field(default=NetScale(), metadata=cap(preset=False))
    description: str = ""
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.topology not in TOPOLOGIES:
            raise ValueError(f"network.topology={self.topology!r}; choose one of "
                             f"{list(TOPOLOGIES)}")
        if self.node_topology not in FABRICS:
            raise ValueError(f"network.node_topology={self.node_topology!r}; choose one of "
                             f"{list(FABRICS)}")
        if not self.call_latency_scale > 0:
            raise ValueError(f"network.call_latency_scale={self.call_latency_scale} must be "
                             "> 0 (a multiplier of every base latency)")
        for p, v in self.hop_latency_scale.items():
            if not v > 0:
                raise ValueError(f"network.hop_latency_scale.{p}={v} must be > 0 (a "
                                 f"multiplier of every {p} hop latency)")
        if self.channels < 0:
            raise ValueError(f"network.channels={self.channels} must be >= 0 (0: no rule)")
        if self.nvls_channels < 0:
            raise ValueError(f"network.nvls_channels={self.nvls_channels} must be >= 0 (0: "
                             "the ring's channel rule)")
        if self.devices_per_node < 0:
            raise ValueError(f"network.devices_per_node={self.devices_per_node} must be >= 0 "
                             "(0: one node)")
        if self.topology == "hierarchical" and self.inter is None:
            raise ValueError("network.topology='hierarchical' needs an [inter] transport "
                             "(the NICs and the network between nodes)")
        if "simple" not in self.efficiency:
            raise ValueError("network.efficiency needs at least the 'simple' protocol")
        for p, v in self.efficiency.items():
            if not 0 < v <= 1:
                raise ValueError(f"network.efficiency_{p}={v} must be in (0, 1]")
        for p in self.efficiency:
            for t in (self.intra, self.inter):
                if t is not None:
                    t.latency(p)
        if not 0 <= self.nvls_efficiency <= 1:
            raise ValueError(f"network.nvls_efficiency={self.nvls_efficiency} must be in "
                             "[0, 1] (0: the switch cannot reduce)")
        for k, v in (*self.base_latency_s.items(), *self.max_bw_bytes_per_s.items()):
            if not v >= 0:
                raise ValueError(f"network.{k}={v} must be >= 0")

    @property
    def fabric(self) -> str:
        """The topology inside one node."""
        return self.node_topology if self.topology == "hierarchical" else self.topology

    @property
    def protocols(self) -> tuple[str, ...]:
        """Protocols this network runs, in NCCL's order."""
        return tuple(p for p in PROTOCOLS if p in self.efficiency)

    def channel_share(self, proto: str, nbytes: float, nranks: int) -> float:
        """Share of the port a call of nbytes drives: NCCL gives a small call fewer channels
        (and a single channel fewer threads) until each thread has its threshold of bytes
        (enqueue.cc:1590-1606); 1 when the network names no channel count."""
        if not self.channels:
            return 1.0
        nc, nt = self._channels_threads(proto, nbytes, nranks)
        return nc / self.channels * nt / NCCL_THREADS[proto]

    def kernel_blocks(self, algorithm: str, proto: str, nbytes: float, nranks: int) -> int:
        """Thread blocks of a call's kernel, one per channel it runs (NCCL src/enqueue.cc,
        ncclLaunchKernel: grid = the channel count), each holding an SM while the call
        runs (`sim.sms`); NVLS runs its own channel count; 0 when no count is named."""
        if algorithm == "nvls" and self.nvls_channels:
            return self.nvls_channels
        return self._channels_threads(proto, nbytes, nranks)[0] if self.channels else 0

    def _channels_threads(self, proto: str, nbytes: float, nranks: int) -> tuple[int, int]:
        """NCCL's channels and threads per channel for a call of nbytes
        (enqueue.cc:1590-1606)."""
        thr = NCCL_THREAD_THRESHOLD[proto] * (nranks if proto == "ll" else 1)
        nc, nt = self.channels, NCCL_THREADS[proto]
        while nc >= 2 and nbytes < nc * nt * thr:
            nc -= 1
        while nbytes < nc * nt * thr and nt % 128 == 0:
            nt //= 2
        return nc, nt

    def hop_scale(self, proto: str) -> float:
        """The calibrated multiple of NCCL's hop latency a protocol's step takes."""
        return self.hop_latency_scale.get(proto, 1.0)

    def nccl_base(self, algorithm: str, proto: str) -> float:
        """NCCL's fixed cost of one collective call, unscaled (baseLat: launch, setup; the
        hierarchical form is rings, so it pays the ring's; tree and nvls their own, and
        nvls_tree NVLS's: NCCL's hwLat[NVLINK][NVLS_TREE] = hwLat[NVLINK][NVLS], tuning.cc:69)."""
        algo = {"nvls": "nvls", "nvls_tree": "nvls", "tree": "tree"}.get(algorithm, "ring")
        return self.base_latency_s.get(f"{algo}_{proto}", 0.0)

    def base(self, algorithm: str, proto: str) -> float:
        """What one call pays before its first byte moves: NCCL's base x the call scale."""
        return self.nccl_base(algorithm, proto) * self.call_latency_scale

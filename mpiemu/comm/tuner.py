"""NCCL's tuner: the algorithms a group can run, and the algorithm and protocol NCCL picks for
a call, by NCCL's own model (no MPI: the configuration checks ask it too).

NCCL predicts every (algorithm, protocol)'s time of a call from fixed tables and runs the
lowest (src/graph/tuning.cc ncclTopoTuneModel and ncclTopoGetAlgoTime, src/enqueue.cc
topoGetAlgoInfo; digest with line numbers in docs/nccl_model.md 1-4, tag v2.21.5-1):

    time = latency + S / algBw,   algBw = busBw x ratio (ring n/nsteps, tree 1/2,
                                                         nvls and nvls_tree 5/6)

The chosen call then runs on the emulated network, which times it message by message
(`comm.cost` has its closed forms). The two differ as they do for NCCL itself: its model
counts latencies as relative costs (used unscaled here; `network.*_latency_scale` is what
measured calls take) and, on two nodes, counts ring and tree at the NVLink rate
(tuning.cc:174, bwIntra when nNodes <= 2), so it keeps the ring for a large all-reduce that
the tree would finish sooner (2 x OCI A100 under NCCL 2.29.3 measure the ring's rate,
results/collectives/).

The model's inputs are the network preset's own numbers: the bandwidth of a node's graph
(nChannels x bwIntra: the intra transport's rate; across more than two nodes nChannels x
bwInter: one NIC per device), base and hop latencies per algorithm and protocol, the
protocols' efficiency and ceilings. NCCL's per-channel caps (tuning.cc:93-105) are left
out: on the DGX presets they lie above the bandwidth they would cap (docs/nccl_model.md 6).
"""
from __future__ import annotations

import math
from typing import NamedTuple, Sequence

from ..net import Network
from ..net.spec import NetworkSpec


class Choice(NamedTuple):
    """An algorithm and protocol for one collective call."""

    algorithm: str
    protocol: str


# tuning.cc:413-415 treeCorrectionFactor[proto][log2i(nBytes >> 6)], below 2^23 x 64 B
TREE_CORRECTION = {
    "ll": (1, 1, 1, 1, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1, 1, 1, 1),
    "ll128": (1, 1, 1, 1, 1, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1,
              1),
    "simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7,
               .8, .9, .9),
}
TREE_BW = 0.92                  # tuning.cc:182 tree busBw x 0.92 (every protocol)
TREE_LL = 1 / 3.8               # tuning.cc:183 tree LL
TREE_LL128 = (7 / 9, 120 / 128)  # tuning.cc:184 tree LL128: one node, several nodes
NVLS_RATIO = 5 / 6              # tuning.cc:216 NVLS / NVLS Tree bus-to-algorithm bandwidth
NET_OVERHEAD_S = 1e-6           # tuning.cc:109-118 x86 (Intel) post overhead, x3 for Simple
RING_SIMPLE_PLATEAU = 1.4       # tuning.cc:437-440 ring Simple all-reduce across nodes, sm>=80


def steps(op: str, n: int, nodes: int) -> tuple[int, int]:
    """(nsteps, nInterSteps) of a ring call (tuning.cc:158-163)."""
    if op == "all_reduce":
        return 2 * (n - 1), (2 * nodes if nodes > 1 else 0)
    return n - 1, nodes - 1


def algbw_bytes_per_s(spec: NetworkSpec, op: str, ch: Choice, n: int, nodes: int,
                      bidirectional: bool = False) -> float:
    """NCCL's algorithm bandwidth of a call (tuning.cc:174-219). Its graph's bandwidth is
    what its rings carry in all: a bidirectional ring on links of its own (a mesh, a ring
    fabric) carries twice a link's rate; on a switch both directions leave by one port."""
    if ch.algorithm == "nvls":
        return spec.intra.bw_bytes_per_s * NVLS_RATIO
    ppn = n // nodes
    if ch.algorithm == "nvls_tree":             # tuning.cc:176 min(bwIntra, bwInter[/2])
        assert spec.inter is not None
        nics = spec.inter.bw_bytes_per_s * ppn * (1 if nodes <= 2 else 0.5)
        return min(spec.intra.bw_bytes_per_s, nics) * NVLS_RATIO
    if nodes <= 2 or spec.inter is None:
        both = bidirectional and spec.fabric != "switch"
        bus = spec.intra.bw_bytes_per_s * (2 if both else 1)
    else:
        bus = spec.inter.bw_bytes_per_s * ppn
    cap = spec.max_bw_bytes_per_s.get(ch.protocol)
    if ch.algorithm == "tree":
        bus *= TREE_BW
        if ch.protocol == "ll":
            bus *= TREE_LL
        elif ch.protocol == "ll128":
            bus *= TREE_LL128[nodes > 1]
        bus = min(bus, cap) if cap and ch.protocol == "ll" else bus
        return bus / 2
    bus *= spec.efficiency[ch.protocol]
    bus = min(bus, cap) if cap else bus
    return bus * n / steps(op, n, nodes)[0]


def latency_s(spec: NetworkSpec, op: str, ch: Choice, n: int, nodes: int) -> float:
    """NCCL's latency of a call (tuning.cc:225-263), unscaled."""
    a, p = ch.algorithm, ch.protocol
    base = spec.nccl_base(a, p)
    intra = spec.intra.latency(p, a)
    net_algo = "ring" if a == "nvls_tree" else a
    inter = spec.inter.latency(p, net_algo) if spec.inter is not None and nodes > 1 else 0.0
    if a == "nvls":
        return base + inter
    if a == "nvls_tree":        # tuning.cc:261-262; hwLat[NET][NVLS_TREE] = the ring's 14 us
        return base + 2 * int(math.log2(nodes)) * inter
    if a == "tree":
        return base + 2 * ((n // nodes - 1) * intra + int(math.log2(nodes)) * inter)
    nsteps, ninter = steps(op, n, nodes)
    if nodes > 1:
        intra = max(intra, NET_OVERHEAD_S * (3 if p == "simple" else 1))
    return base + (nsteps - ninter) * intra + ninter * inter


def predicted_s(spec: NetworkSpec, op: str, nbytes: float, n: int, nodes: int,
                ch: Choice, bidirectional: bool = False) -> float:
    """NCCL's predicted time of one call (tuning.cc:418-445)."""
    bw = algbw_bytes_per_s(spec, op, ch, n, nodes, bidirectional)
    lat = latency_s(spec, op, ch, n, nodes)
    if ch.algorithm == "tree":
        log = int(math.log2(max(1, int(nbytes) >> 6)))
        if log < 23:
            bw *= TREE_CORRECTION[ch.protocol][log]
    if (ch.algorithm, ch.protocol, op) == ("ring", "simple", "all_reduce") and nodes > 1 \
            and nbytes / (max(1, spec.channels // 2) * n) >= 64:
        lat *= RING_SIMPLE_PLATEAU
    return lat + nbytes / bw


def candidates(algos: Sequence[str], protos: Sequence[str]) -> list[Choice]:
    """Every (algorithm, protocol) NCCL models among these: NVLS and NVLS Tree run Simple
    only (tuning.cc:172)."""
    return [Choice(a, p) for a in algos for p in protos
            if a not in ("nvls", "nvls_tree") or p == "simple"]


def pick(spec: NetworkSpec, op: str, nbytes: float, n: int, nodes: int, cands: list[Choice],
         bidirectional: bool = False) -> Choice:
    """The candidate NCCL predicts fastest (enqueue.cc:1500-1524: the lowest time wins)."""
    return min(cands, key=lambda ch: predicted_s(spec, op, nbytes, n, nodes, ch,
                                                 bidirectional))


def node_groups(net: Network, devices: Sequence[int]) -> list[list[int]]:
    """Ranks of a group (its devices in rank order) grouped by node, in rank order."""
    by: dict[int, list[int]] = {}
    for r, d in enumerate(devices):
        by.setdefault(net.node_of(d), []).append(r)
    return list(by.values())


def allowed_on(net: Network, devices: Sequence[int], op: str) -> list[str]:
    """Algorithms a group of these devices can run for `op` on this network."""
    out = ["ring"]
    if op != "all_reduce":
        return out
    groups = node_groups(net, devices)
    k = len(groups[0])
    nvls = len(devices) > 2 and k == net.per_node and net.spec.nvls_efficiency > 0 \
        and net.spec.fabric == "switch"     # more than 2 GPUs (NCCL nvls.cc:241), whole nodes
    if len(groups) > 1 and all(len(g) == k for g in groups):
        out.append("tree")     # NCCL: the tree crosses nodes (a chain inside each)
        if k > 1:
            out.append("hierarchical")
        if nvls and k > 1:
            out.append("nvls_tree")
    if len(groups) == 1 and nvls:
        out.append("nvls")
    return out

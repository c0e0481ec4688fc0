"""Which network ports a run's messages kept busy, and which kind bounds its collectives.

Every message is traced on its sender under its route (`net.message`: `port.3.out>port.5.in`,
`nic.3.out>nic.11.in`, `link.0>1`) for as long as it holds the egress port. Per rank and
port, the union of those events is the port's busy time; the busiest port of each kind
(intra-node: NVSwitch port or link; inter-node: NIC) against the time the rank spent in
collectives says what bounded them: a DP all-reduce across nodes whose NICs are busy most
of its span is bounded by the inter-node hop.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .load import Run
from .intervals import union_length

KINDS = {"port": "intra-node (switch port)", "link": "intra-node (link)",
         "nic": "inter-node (NIC)"}


def egress_port(resource: str) -> str | None:
    """The sender's port of a message route (`port.3.out>port.5.in` -> `port.3.out`), None
    for anything else (streams, `in:` receive records)."""
    return resource.split(">")[0] if resource.split(".")[0] in KINDS else None


@dataclass(frozen=True)
class PortBusy:
    """The busiest port of one kind: where, how long, and against the collectives' time."""

    kind: str
    rank: int
    port: str
    busy_s: float
    collective_s: float
    nbytes: int

    @property
    def share(self) -> float:
        return self.busy_s / self.collective_s if self.collective_s > 0 else 0.0


def busiest_ports(run: Run) -> list[PortBusy]:
    """Per kind, the port with the most busy time on any rank (busiest first)."""
    best: dict[str, PortBusy] = {}
    for rt in run.ranks:
        ev = rt.events
        coll = rt.is_cat("collective")
        coll_s = union_length(ev["t_start"][coll], ev["t_end"][coll])
        ports: dict[str, list[np.ndarray]] = {}
        for res, idx in rt.by_resource():
            port = egress_port(res)
            if port is not None:
                ports.setdefault(port, []).append(idx[rt.is_cat("comm", idx)])
        for port, parts in ports.items():
            ix = np.sort(np.concatenate(parts))
            busy = union_length(ev["t_start"][ix], ev["t_end"][ix])
            kind = KINDS[port.split(".")[0]]
            if kind not in best or busy > best[kind].busy_s:
                best[kind] = PortBusy(kind, rt.rank, port, busy, coll_s,
                                      int(ev["bytes"][ix].sum()))
    return sorted(best.values(), key=lambda p: -p.busy_s)


def format_network(run: Run) -> list[str]:
    """The `mpiemu analyze` table of busiest ports and the bound it implies."""
    rows = busiest_ports(run)
    if not rows:
        return []
    lines = ["network ports (busiest of each kind; busy = union of messages leaving it):",
             f"{'kind':<26}{'rank':>5}  {'port':<14}{'busy ms':>10}{'MB':>11}"
             f"{'of collectives':>16}"]
    for p in rows:
        lines.append(f"{p.kind:<26}{p.rank:>5}  {p.port:<14}{p.busy_s * 1e3:>10.4f}"
                     f"{p.nbytes / 1e6:>11.3f}{100 * p.share:>15.1f}%")
    lines.append(f"collectives bounded by: {rows[0].kind} ({rows[0].port} on rank "
                 f"{rows[0].rank} busy {100 * rows[0].share:.1f}% of their time)")
    return lines + [""]

"""Network layer: how emulated devices connect, what a message occupies, when it arrives.

`spec` (transports, protocols, NCCL-grounded collective costs), `presets` (sourced TOML),
`topology` (nodes, ports, routes), `message` (the one message path every send takes).
Below `comm/`: it knows nothing of MPI or collectives' data (docs/network.md).
"""
from .message import HEADER_LEN, arrival, send
from .presets import list_networks, load_network
from .spec import ALGORITHMS, PROTOCOLS, TOPOLOGIES, NetworkSpec, Transport
from .topology import Hop, Network

__all__ = ["ALGORITHMS", "HEADER_LEN", "Hop", "Network", "NetworkSpec", "PROTOCOLS",
           "TOPOLOGIES", "Transport", "arrival", "list_networks", "load_network", "send"]

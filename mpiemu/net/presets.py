"""Network presets: TOML data files beside this module, every number with its source.

Layout (units in key names, as device presets):

    name = "dgx-a100"
    description = "..."
    topology = "hierarchical"          # ring | switch | fully-connected | hierarchical
    node_topology = "switch"           # the fabric inside a node (hierarchical only)
    [node]        devices_per_node_count
    [intra]       bw_GBps, latency_ll_us, latency_ll128_us, latency_simple_us
    [inter]       the same for a device's NIC and the network behind it (optional)
    [collectives] base_ring_<protocol>_us, efficiency_<protocol>_frac,
                  max_bw_<protocol>_GBps (a protocol's ceiling per port, optional)

`load_network` builds the `NetworkSpec` with the capability walk of `devices.caps`; an entry no
field reads is refused, as in device presets.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..devices.presets import (PresetError, all_quantities, build_spec, bundled_names,
                          read_once_if_bundled, read_preset)
from .spec import NetworkSpec

TOP_LEVEL = ("name", "topology", "node_topology", "description")


def preset_dir() -> Path:
    return Path(__file__).with_name("presets")   # files on disk (importlib.resources: +1 MB/rank)


def list_networks() -> list[str]:
    """Names of the bundled network presets."""
    return list(bundled_names(preset_dir()))


def load_network(name_or_path: str) -> NetworkSpec:
    """A NetworkSpec from a bundled preset name or a path; PresetError says what is wrong. A
    bundled preset is read once per process (a spec is immutable); a file, at every call."""
    return _load_network(name_or_path)


def _read_network(name_or_path: str) -> NetworkSpec:
    raw = read_preset(name_or_path, preset_dir(), "network.preset")
    name = str(raw.get("name", name_or_path))
    secs = all_quantities(raw)
    given: dict[str, Any] = {k: str(raw[k]) for k in TOP_LEVEL if k in raw}
    given.setdefault("name", name)
    if "topology" not in given:
        raise PresetError(f"network preset {name}: missing top-level 'topology'")
    return build_spec(NetworkSpec, raw, secs, name, given,  # type: ignore[no-any-return]
                      "network spec", f"mpiemu devices --network {name}")


_load_network = read_once_if_bundled(_read_network, preset_dir())

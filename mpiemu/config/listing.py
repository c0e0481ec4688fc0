"""`mpiemu devices`: every capability a model reads, its effective value and its source.

`mpiemu devices NAME --set device.<path>=VALUE` shows the spec a workload with those
overrides would play: overridden and scaled values are marked, defaults too.
`mpiemu devices --network [NAME]` does the same for the network presets.
"""
from __future__ import annotations

from typing import Any, Sequence

from ..devices.caps import apply_overrides, walk
from ..devices.presets import list_presets, load_device
from ..devices.specs import DeviceSpec
from ..net import NetworkSpec, list_networks, load_network
from .workload import load_workload


def _summary_row(d: DeviceSpec) -> str:
    fp16 = d.peak_flops_per_s.get("fp16", 0.0) / 1e12
    fp32 = d.peak_flops_per_s.get("fp32", 0.0) / 1e12
    sections = "+".join(s for s in ("t3", "nmc", "sunway") if getattr(d, s) is not None)
    return (f"{d.name:<18}{d.kind:<8}{d.compute_units:>5}{d.clock_hz / 1e9:>7.2f}"
            f"{fp16:>9.1f}{fp32:>9.1f}{d.dram_bw_bytes_per_s / 1e9:>11.0f}"
            f"{d.dram_capacity_bytes / 2**30:>6.0f}{d.llc_bytes / 2**20:>9.0f}  "
            f"{d.network:<14}{sections or '-'}")


def _flag(source: str) -> tuple[str, str]:
    for tag in ("OVERRIDE", "SCALED", "ASSUMPTION"):
        if source.upper().startswith(tag):
            return tag, source.removeprefix(tag).lstrip(": ")
    return ("default", "the spec's default (no preset entry)") if not source \
        else ("sourced", source)


def _value(v: Any) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def capability_lines(d: DeviceSpec | NetworkSpec) -> list[str]:
    """One line per capability: dotted path (its `--set device.<path>`), value, flag, source."""
    lines = [f"{d.name}: {d.description}"]
    for path, v in walk(d):
        flag, src = _flag(d.sources.get(path, ""))
        lines.append(f"  {path:<36} {_value(v):<14} [{flag}] {src}")
    return lines


def resolve(name: str, overrides: Sequence[str] = ()) -> DeviceSpec:
    """The preset with `--set device.<path>=value` overrides applied, as a run would."""
    if not overrides:
        return load_device(name)
    w = load_workload(None, [f"device.preset={name!r}", *overrides])
    return apply_overrides(load_device(name), w.device.overrides)  # type: ignore[no-any-return]


def format_devices(name: str | None = None, brief: bool = False,
                   overrides: Sequence[str] = ()) -> list[str]:
    """Summary table of presets, then every capability with its source (SI units)."""
    specs = [resolve(name, overrides)] if name else [load_device(n) for n in list_presets()]
    lines = [f"{'preset':<18}{'kind':<8}{'CUs':>5}{'GHz':>7}{'fp16 TF':>9}{'fp32 TF':>9}"
             f"{'DRAM GB/s':>11}{'GiB':>6}{'LLC MiB':>9}  {'network':<14}sections"]
    lines += [_summary_row(d) for d in specs]
    return lines + ([] if brief else _capabilities(
        specs, " (the unit is in the field name); override any with --set device.<path>=VALUE "
        "(or a preset unit: device.dram_bw_GBps=2000)"))


def _capabilities(specs: Sequence[DeviceSpec | NetworkSpec], how: str) -> list[str]:
    """The legend and every field of every spec with its source."""
    lines = ["", f"values in SI units{how}; [ASSUMPTION] = not stated by any source, "
             "reasoning given"]
    for s in specs:
        lines += capability_lines(s)
    return lines


def _net_row(n: NetworkSpec) -> str:
    inter = f"{n.inter.bw_bytes_per_s / 1e9:>9.1f}" if n.inter else f"{'-':>9}"
    return (f"{n.name:<14}{n.topology:<16}{n.fabric:<16}{n.devices_per_node or '-':>6}"
            f"{n.intra.bw_bytes_per_s / 1e9:>10.1f}{inter}  {'/'.join(n.protocols)}")


def format_networks(name: str | None = None, brief: bool = False,
                    overrides: Sequence[str] = ()) -> list[str]:
    """Summary table of network presets, then every field with its source (SI units)."""
    if name and overrides:
        w = load_workload(None, [f"network.preset={name!r}", *overrides])
        specs = [apply_overrides(load_network(name), w.network.overrides, root="network")]
    else:
        specs = [load_network(n) for n in ([name] if name else list_networks())]
    lines = [f"{'network':<14}{'topology':<16}{'node fabric':<16}{'/node':>6}"
             f"{'port GB/s':>10}{'NIC GB/s':>9}  protocols"]
    lines += [_net_row(n) for n in specs]
    return lines + ([] if brief else _capabilities(
        specs, "; override any with --set network.<path>=VALUE (or a preset unit: "
        "network.intra.bw_GBps=75)"))

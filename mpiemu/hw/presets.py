"""Device presets: TOML data files where every number carries its source.

A numeric entry is written `key_UNIT = { value = 1.4, source = "thesis Table 8.1" }`; the unit
suffix is converted to SI here. A source that starts with "ASSUMPTION" marks a value that no
paper states (the reasoning follows in the same string).
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

from .specs import DeviceSpec, GemmTiling, KernelSpec, LinkSpec

UNIT_SCALE: dict[str, float] = {
    "GHz": 1e9, "TFLOPS": 1e12, "GFLOPS": 1e9, "GBps": 1e9, "GiB": 2.0**30, "GB": 1e9,
    "MiB": 2.0**20, "KiB": 2.0**10, "us": 1e-6, "ns": 1e-9, "s": 1.0, "frac": 1.0, "count": 1.0,
}
DTYPES = ("fp16", "bf16", "tf32", "fp32", "fp64")


class PresetError(ValueError):
    """A preset file is malformed (missing source, unknown unit, missing key)."""


@dataclass(frozen=True)
class Quantity:
    """A preset number in SI units with its source."""

    value: float
    source: str

    @property
    def is_assumption(self) -> bool:
        return self.source.upper().startswith("ASSUMPTION")


def _split_unit(key: str) -> tuple[str, float]:
    base, _, unit = key.rpartition("_")
    if unit in UNIT_SCALE and base:
        return base, UNIT_SCALE[unit]
    return key, 1.0


def _quantities(section: Mapping[str, Any], where: str) -> dict[str, Quantity]:
    """Every `{value, source}` entry of a TOML section, keyed by name without unit, in SI."""
    out: dict[str, Quantity] = {}
    for key, entry in section.items():
        if not isinstance(entry, dict):
            continue
        if "value" not in entry or not str(entry.get("source", "")).strip():
            raise PresetError(f"{where}.{key}: every number needs a value and a source")
        base, scale = _split_unit(key)
        out[base] = Quantity(float(entry["value"]) * scale, str(entry["source"]))
    return out


def _need(q: Mapping[str, Quantity], key: str, where: str) -> float:
    if key not in q:
        raise PresetError(f"{where}: missing {key!r}")
    return q[key].value


def _preset_dir() -> Path:
    return Path(str(resources.files("mpiemu.hw") / "presets"))


def list_presets() -> list[str]:
    """Names of the bundled device presets."""
    return sorted(p.stem for p in _preset_dir().glob("*.toml"))


def read_preset(name_or_path: str) -> dict[str, Any]:
    """Raw TOML of a bundled preset name or a path to a preset file."""
    path = Path(name_or_path)
    if not path.suffix:
        path = _preset_dir() / f"{name_or_path}.toml"
    if not path.exists():
        raise PresetError(f"device={name_or_path!r} is not a preset; choose one of "
                          f"{list_presets()} or give a path to a preset .toml")
    with path.open("rb") as f:
        return tomllib.load(f)


def all_quantities(raw: Mapping[str, Any]) -> dict[str, dict[str, Quantity]]:
    """Per section, the sourced numbers of a raw preset (for `mpiemu devices`)."""
    name = str(raw.get("name", "?"))
    return {sec: _quantities(raw[sec], f"{name}.{sec}") for sec in raw
            if isinstance(raw[sec], dict)}


def link_from(q: Mapping[str, Quantity], topology: str, where: str) -> LinkSpec:
    """A LinkSpec from the quantities of a `[link]` section."""
    return LinkSpec(latency_s=_need(q, "latency", where),
                    bw_bytes_per_s=_need(q, "bw_per_direction", where),
                    topology=topology,
                    sources={k: v.source for k, v in q.items()})


def _gemm_tiling(q: Mapping[str, Quantity], where: str) -> GemmTiling:
    try:
        return GemmTiling.from_quantities({k: v.value for k, v in q.items()}, where)
    except ValueError as exc:
        raise PresetError(str(exc)) from None


def load_device(name_or_path: str) -> DeviceSpec:
    """Build a DeviceSpec from a preset; raises PresetError naming what is wrong."""
    raw = read_preset(name_or_path)
    name = str(raw.get("name", name_or_path))
    secs = all_quantities(raw)
    comp, mem = secs.get("compute", {}), secs.get("memory", {})
    gemm, link = secs.get("gemm", {}), secs.get("link", {})
    peaks = {d: comp[f"peak_{d}"].value for d in DTYPES if f"peak_{d}" in comp}
    if not peaks:
        raise PresetError(f"{name}.compute: needs at least one peak_<dtype>_TFLOPS")
    sources = {f"{sec}.{k}": v.source for sec, qs in secs.items() for k, v in qs.items()}
    topology = str(raw.get("link", {}).get("topology", "ring"))
    return DeviceSpec(
        name=name, kind=str(raw.get("kind", "gpu")), peak_flops_per_s=peaks,
        vector_flops_per_s=_need(comp, "vector_fp32", f"{name}.compute"),
        dram_bw_bytes_per_s=_need(mem, "dram_bw", f"{name}.memory"),
        dram_capacity_bytes=_need(mem, "dram_capacity", f"{name}.memory"),
        llc_bytes=_need(mem, "llc", f"{name}.memory"),
        compute_units=int(_need(comp, "compute_units", f"{name}.compute")),
        clock_hz=_need(comp, "clock", f"{name}.compute"),
        kernel_launch_s=_need(comp, "kernel_launch", f"{name}.compute"),
        dram_efficiency=_need(mem, "dram_efficiency", f"{name}.memory"),
        gemm=_gemm_tiling(gemm, f"{name}.gemm"),
        kernels=KernelSpec.from_quantities({k: v.value for k, v in
                                            secs.get("kernels", {}).items()}),
        link=link_from(link, topology, f"{name}.link"),
        description=str(raw.get("description", "")),
        sources=sources,
        extra={k: v.value for k, v in secs.get("extra", {}).items()},
    )

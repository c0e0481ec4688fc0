"""Device presets: TOML data files where every number carries its source.

A numeric entry is written `key_UNIT = { value = 1.4, source = "thesis Table 8.1" }`; the unit
suffix is converted to SI here. A source that starts with "ASSUMPTION" marks a value that no
paper states (the reasoning follows in the same string).
"""
from __future__ import annotations

import functools
import math

import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Mapping, TypeVar

from .caps import UNITS, CapError, Quantity, load_spec
from .specs import DeviceSpec

UNIT_SCALE: dict[str, float] = {unit: factor for unit, (factor, _) in UNITS.items()}
TOP_LEVEL = ("name", "kind", "description", "network")   # strings, not quantities
T = TypeVar("T")


class PresetError(ValueError):
    """A preset file is malformed (missing source, unknown unit, missing key)."""


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
            raise PresetError(f"{where}.{key}={entry!r}: every number is a table "
                              "{ value = ..., source = \"...\" }")
        if "value" not in entry or not str(entry.get("source", "")).strip():
            raise PresetError(f"{where}.{key}: every number needs a value and a source")
        base, scale = _split_unit(key)
        try:
            value = float(entry["value"]) * scale
        except (TypeError, ValueError):
            raise PresetError(f"{where}.{key}={entry['value']!r}: a number") from None
        if not math.isfinite(value):
            raise PresetError(f"{where}.{key}={entry['value']!r}: a finite number")
        out[base] = Quantity(value, str(entry["source"]))
    return out


def _preset_dir() -> Path:
    return Path(__file__).with_name("presets")   # files on disk (importlib.resources: +1 MB/rank)


def list_presets() -> list[str]:
    """Names of the bundled device presets."""
    return list(bundled_names(_preset_dir()))


@functools.lru_cache(maxsize=None)
def bundled_names(directory: Path) -> tuple[str, ...]:
    """Names of the preset files shipped in `directory` (device, network, model presets)."""
    return tuple(sorted(p.stem for p in directory.glob("*.toml")))


def read_once_if_bundled(read: Callable[[str], T], directory: Path) -> Callable[[str], T]:
    """`read(name_or_path)`, remembering what it built from a preset bundled in `directory`
    (a spec is immutable, and validation asks for the same one many times); a file is read
    at every call."""
    cached = functools.lru_cache(maxsize=None)(read)

    def load(name_or_path: str) -> T:
        return (cached if name_or_path in bundled_names(directory) else read)(name_or_path)
    return load


def read_preset(name_or_path: str, directory: Path | None = None,
                what: str = "device") -> dict[str, Any]:
    """Raw TOML of a bundled preset name (in `directory`) or a path to a preset file."""
    directory = directory or _preset_dir()
    path = Path(name_or_path)
    if not path.suffix:
        path = directory / f"{name_or_path}.toml"
    if not path.is_file():
        raise PresetError(f"{what}={name_or_path!r} is not a preset; choose one of "
                          f"{list(bundled_names(directory))} or give a path to a preset .toml")
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise PresetError(f"{what} preset {path}: not valid TOML ({exc})") from None


def all_quantities(raw: Mapping[str, Any]) -> dict[str, dict[str, Quantity]]:
    """Per section, the sourced numbers of a raw preset (for `mpiemu devices`)."""
    name = str(raw.get("name", "?"))
    return {sec: _quantities(raw[sec], f"{name}.{sec}") for sec in raw
            if isinstance(raw[sec], dict)}


def unused_entry(raw: Mapping[str, Any], secs: Mapping[str, Mapping[str, Quantity]],
            used: set[tuple[str, str]], name: str) -> str | None:
    """The first preset entry no field reads (a typo, or a section no model knows)."""
    for sec, qs in secs.items():
        for key in qs:
            if (sec, key) not in used:
                entry = [k for k in raw[sec] if _split_unit(k)[0] == key][0]
                return f"{name}.{sec}.{entry}"
    return None


def load_device(name_or_path: str) -> DeviceSpec:
    """Build a DeviceSpec from a preset (every section a field of the spec tree, `caps`);
    raises PresetError naming what is wrong, including an entry no field reads. A bundled
    preset is read once per process (a spec is immutable); a file, at every call."""
    return _load_device(name_or_path)


def _read_device(name_or_path: str) -> DeviceSpec:
    raw = read_preset(name_or_path)
    name = str(raw.get("name", name_or_path))
    secs = all_quantities(raw)
    given: dict[str, Any] = {k: str(raw.get(k, d)) for k, d in
                             zip(TOP_LEVEL, (name_or_path, "gpu", "", ""))}
    return build_spec(DeviceSpec, raw, secs, name, given, "device spec",
                      f"mpiemu devices {name}")


_load_device = read_once_if_bundled(_read_device, _preset_dir())


def build_spec(cls: type, raw: Mapping[str, Any], secs: Mapping[str, Mapping[str, Quantity]],
               name: str, given: Mapping[str, Any], what: str, lister: str) -> Any:
    """Spec `cls` from a preset's sections (the `caps` walk) with each field's source;
    PresetError names what is wrong, including an entry no field reads (`lister`: the
    command that lists the fields)."""
    used: set[tuple[str, str]] = set()
    sources: dict[str, str] = {}
    try:
        spec = load_spec(cls, secs, "", name, used, sources, given=given)
    except (CapError, ValueError) as exc:
        raise PresetError(str(exc)) from None
    bad = unused_entry(raw, secs, used, name)
    if bad is not None:
        raise PresetError(f"{bad}: no field of the {what} reads it ({lister} lists them)")
    return replace(spec, sources=sources)

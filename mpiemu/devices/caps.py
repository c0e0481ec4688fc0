"""Typed device capabilities: presets -> the DeviceSpec tree, overrides, scale knobs, sources.

Every number a model reads is a field of a frozen spec dataclass (`DeviceSpec` and the specs
nested in it: `GemmTiling`, `KernelSpec`, `T3Params`, `NmcSpec`, `SunwayParams`, ...). One
generic walk over those fields loads them from a preset, applies `--set device.<path>=value`
overrides, applies the what-if scale knobs and reports where each value came from, so a
field added to any spec class is covered without more code. Conventions:

* a field's unit is in its name, in SI (`dram_bw_bytes_per_s`, `clock_hz`, `wave_fixed_s`);
  a preset key (or an override key) may carry a unit of `UNITS` instead: `dram_bw_GBps`
  -> `dram_bw_bytes_per_s`, `efficiency_frac` -> `efficiency`, `tile_m_count` -> `tile_m`,
  `call_latency_scale_x` (a multiplier) -> `call_latency_scale`;
* a nested spec is the preset section named like its field (`gemm` <- `[gemm]`); a field
  names another section in its metadata (`cap(section="memory")`);
* `cap(key=...)`: the preset key when it is not the field name without its unit; a Mapping
  field reads every key matching its `key` pattern (`peak_{}` -> `peak_fp16`, ...);
* `cap(scale="compute")` marks a rate of the compute side that `device.scale.compute`
  multiplies (`inverse=True`: a time it divides); likewise `scale="memory_bw"`, and
  `scale="bw"` for the network's rates (`network.scale.bw`, `net.spec.NetworkSpec`).
The same walk serves the device (`--set device.<path>`) and the network (`--set
network.<path>`): `root` names which in messages.
"""
from __future__ import annotations

import collections.abc
import dataclasses
import math
import types
import typing
from dataclasses import dataclass, fields, replace
from typing import Any, Iterator, Mapping

# preset unit suffix -> (factor to SI, SI suffix of the field name)
UNITS: dict[str, tuple[float, str]] = {
    "GHz": (1e9, "hz"), "TFLOPS": (1e12, "flops_per_s"), "GFLOPS": (1e9, "flops_per_s"),
    "GBps": (1e9, "bytes_per_s"), "GiB": (2.0**30, "bytes"), "GB": (1e9, "bytes"),
    "MiB": (2.0**20, "bytes"), "KiB": (2.0**10, "bytes"), "us": (1e-6, "s"), "ns": (1e-9, "s"),
    "s": (1.0, "s"), "frac": (1.0, ""), "count": (1.0, ""), "x": (1.0, ""),
    "cycles": (1.0, "cycles"),
}
SCALES = ("compute", "memory_bw", "bw")
NOT_CAPABILITIES = ("name", "kind", "description", "sources", "network", "topology",
                    "node_topology")                 # identity, provenance, wiring


class CapError(ValueError):
    """A capability path or value that is not allowed: field, value and what is allowed."""

    def __init__(self, field: str, value: Any, allowed: str) -> None:
        self.field, self.value, self.allowed = field, value, allowed
        super().__init__(f"{field}={value!r}: {allowed}")


@dataclass(frozen=True)
class Quantity:
    """A preset number in SI units with its source."""

    value: float
    source: str

    @property
    def is_assumption(self) -> bool:
        return self.source.upper().startswith("ASSUMPTION")


@dataclass(frozen=True)
class Scale:
    """What-if knobs (thesis 5.3.3.6: compute 2x / 4x faster at equal network): compute
    rates (matrix, vector, SFU peaks, clock, L2 feed) and DRAM bandwidth multipliers."""

    compute: float = 1.0
    memory_bw: float = 1.0

    def __post_init__(self) -> None:
        for name in ("compute", "memory_bw"):
            if not getattr(self, name) > 0:
                raise CapError(f"scale.{name}", getattr(self, name), "a factor > 0")


def cap(section: str | None = None, key: str | None = None, scale: str | None = None,
        inverse: bool = False, entries: tuple[str, ...] = (), preset: bool = True
        ) -> dict[str, Any]:
    """Field metadata of a capability (see the module docstring)."""
    return {"section": section, "key": key, "scale": scale, "inverse": inverse,
            "entries": entries, "preset": preset}


def _meta(f: dataclasses.Field[Any], name: str) -> Any:
    return f.metadata.get(name, cap()[name])


def split_unit(key: str) -> tuple[str, float, str] | None:
    """`dram_bw_GBps` -> ('dram_bw', 1e9, 'bytes_per_s'); None without a known unit."""
    base, _, unit = key.rpartition("_")
    if base and unit in UNITS:
        return (base, *UNITS[unit])
    return None


def _si_name(base: str, suffix: str) -> str:
    return f"{base}_{suffix}" if suffix else base


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def spec_type(tp: Any) -> type | None:
    """The dataclass a field holds (also through `X | None`), else None."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return spec_type(inner[0]) if len(inner) == 1 else None
    return tp if isinstance(tp, type) and dataclasses.is_dataclass(tp) else None


def _is_mapping(tp: Any) -> bool:
    return typing.get_origin(tp) in (collections.abc.Mapping, dict)


def cap_fields(cls: type) -> list[dataclasses.Field[Any]]:
    """The capability fields of a spec class (identity and provenance left out)."""
    return [f for f in fields(cls) if f.init and f.name not in NOT_CAPABILITIES]  # type: ignore[arg-type]


def preset_key(f: dataclasses.Field[Any]) -> str:
    """The unit-less preset key of a scalar field: its `key`, or its name without SI unit."""
    if _meta(f, "key"):
        return str(_meta(f, "key"))
    for _, suffix in sorted(UNITS.values(), key=lambda u: -len(u[1])):
        if suffix and f.name.endswith("_" + suffix):
            return f.name[:-len(suffix) - 1]
    return f.name


def _key_candidates(f: dataclasses.Field[Any]) -> tuple[str, ...]:
    """Unit-less preset keys a scalar field answers to: its `key`, else its own name (a
    count such as `k_block_bytes_count`) or its name without the SI unit (`dram_bw_GBps`)."""
    return (str(_meta(f, "key")),) if _meta(f, "key") else (f.name, preset_key(f))


def resolve_key(cls: type, key: str, where: str, value: Any = None) -> tuple[str, float]:
    """The field of `cls` a key names (its SI name, or base + a unit of `UNITS`) and the
    factor that brings a value given in the key's unit to SI."""
    names = {f.name: f for f in cap_fields(cls)}
    if key in names:
        return key, 1.0
    parts = split_unit(key)
    if parts is not None:
        base, factor, suffix = parts
        for f in names.values():
            if f.name == _si_name(base, suffix) or (preset_key(f) == base
                                                    and not spec_type(_hints(cls)[f.name])):
                return f.name, factor
    raise CapError(where, value, "unknown field; allowed here: " + ", ".join(sorted(names)))


# --- loading a preset ----------------------------------------------------------------------
Sections = Mapping[str, Mapping[str, Quantity]]


def _coerce(tp: Any, v: Any, where: str) -> Any:
    """A value for a field of type `tp` (ints must be integral, bools must be bools)."""
    if tp is bool:
        if not isinstance(v, bool):
            raise CapError(where, v, "true or false")
        return v
    if tp is str:
        if not isinstance(v, str):
            raise CapError(where, v, "a string")
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise CapError(where, v, "a number")
    if not math.isfinite(v):
        raise CapError(where, v, "a finite number")
    if tp is int:
        if float(v) != int(v):
            raise CapError(where, v, "an integer")
        return int(v)
    return float(v)


def _load_mapping(f: dataclasses.Field[Any], q: Mapping[str, Quantity], used: set[str],
                  path: str, sources: dict[str, str]) -> dict[str, float]:
    pattern, out = str(_meta(f, "key") or f.name + "_{}"), {}
    for entry in _meta(f, "entries"):
        k = pattern.format(entry)
        if k in q:
            out[entry] = q[k].value
            sources[f"{path}{f.name}.{entry}"] = q[k].source
            used.add(k)
    return out


def load_spec(cls: type, secs: Sections, section: str, where: str, used: set[tuple[str, str]],
              sources: dict[str, str], path: str = "", given: Mapping[str, Any] = {}) -> Any:
    """Build spec `cls` from preset sections; `used` collects the (section, key) it read,
    `given` holds values built elsewhere (identity strings, the link)."""
    kw: dict[str, Any] = dict(given)
    hints = _hints(cls)
    for f in fields(cls):  # type: ignore[arg-type]
        if not f.init or f.name in given or f.name == "sources" or not _meta(f, "preset"):
            continue
        tp, sub = hints[f.name], spec_type(hints[f.name])
        sec = _meta(f, "section") or (f.name if sub else section)
        if sub is not None:
            has_default = f.default is not dataclasses.MISSING \
                or f.default_factory is not dataclasses.MISSING
            if sec not in secs and has_default:
                continue                   # optional section absent: the field's default
            kw[f.name] = load_spec(sub, secs, sec, where, used, sources, f"{path}{f.name}.")
            continue
        q = secs.get(sec, {})
        if _is_mapping(tp):
            mine: set[str] = set()
            kw[f.name] = _load_mapping(f, q, mine, path, sources)
            used.update((sec, k) for k in mine)
            continue
        key = next((k for k in _key_candidates(f) if k in q), preset_key(f))
        if key in q:
            kw[f.name] = _coerce(tp, q[key].value, f"{where}.{sec}.{key}")
            sources[path + f.name] = q[key].source
            used.add((sec, key))
        elif f.default is dataclasses.MISSING:
            raise ValueError(f"{where}.{sec}: missing {key!r} (with its unit suffix, e.g. "
                             f"{key}_count or {key}_GBps; see mpiemu devices t3-gpu)")
    try:
        return cls(**kw)
    except CapError:
        raise
    except (ValueError, TypeError) as exc:
        raise CapError(f"{where}.{section}", "", str(exc)) from None


# --- overrides ------------------------------------------------------------------------------
def check_path(cls: type, path: str, value: Any, root: str = "device") -> None:
    """Raise CapError unless `path` names a capability of spec class `cls` (type level)."""
    _walk_path(cls, path.split("."), value, root, None)


def _walk_path(cls: type, segs: list[str], value: Any, prefix: str, obj: Any) -> Any:
    """Resolve `segs` inside `cls` (and set it on `obj` when given); returns the new obj."""
    where = f"{prefix}.{segs[0]}"
    name, factor = resolve_key(cls, segs[0], where, value)
    f = next(x for x in fields(cls) if x.name == name)  # type: ignore[arg-type]
    tp = _hints(cls)[name]
    sub, cur = spec_type(tp), (getattr(obj, name) if obj is not None else None)
    where = f"{prefix}.{name}"
    if sub is not None:
        if len(segs) == 1:
            raise CapError(where, value, "is a section; name one of its fields: "
                           + ", ".join(x.name for x in cap_fields(sub)))
        if obj is not None and cur is None:
            raise CapError(f"{where}.{'.'.join(segs[1:])}", value,
                           f"this {prefix.split('.')[0]} has no "
                           f"[{_meta(f, 'section') or name}] section")
        new = _walk_path(sub, segs[1:], value, where, cur)
        return replace(obj, **{name: new}) if obj is not None else None
    if _is_mapping(tp):
        entries = _meta(f, "entries")
        if len(segs) != 2 or segs[1] not in entries:
            raise CapError(f"{where}.{'.'.join(segs[1:])}", value,
                           f"name one entry: {where}.<{'|'.join(entries)}>")
        v = _coerce(float, value, f"{where}.{segs[1]}") * factor
        return replace(obj, **{name: {**(cur or {}), segs[1]: v}}) if obj is not None else None
    if len(segs) > 1:
        raise CapError(f"{where}.{'.'.join(segs[1:])}", value, f"{where} is a single value")
    v = _coerce(tp, value, where)
    v = v * factor if factor != 1.0 else v
    return replace(obj, **{name: v}) if obj is not None else None


def set_path(spec: Any, path: str, value: Any, root: str = "device") -> Any:
    """`spec` with the capability at dotted `path` set to `value` (validated by the spec)."""
    try:
        return _walk_path(type(spec), path.split("."), value, root, spec)
    except CapError:
        raise
    except (ValueError, TypeError) as exc:
        raise CapError(f"{root}.{path}", value, str(exc)) from None


# --- scale knobs ----------------------------------------------------------------------------
def _scale_tree(obj: Any, knob: str, factor: float, path: str, touched: list[str]) -> Any:
    changes: dict[str, Any] = {}
    for f in cap_fields(type(obj)):
        v = getattr(obj, f.name)
        if dataclasses.is_dataclass(v):
            new = _scale_tree(v, knob, factor, f"{path}{f.name}.", touched)
            if new is not v:
                changes[f.name] = new
        elif _meta(f, "scale") == knob:
            k = 1.0 / factor if _meta(f, "inverse") else factor
            changes[f.name] = ({e: x * k for e, x in v.items()} if isinstance(v, Mapping)
                               else v * k)
            touched.append(path + f.name)
    return replace(obj, **changes) if changes else obj


def scaled(spec: Any, root: str = "device", **factors: float) -> tuple[Any, list[str]]:
    """`spec` with every field tagged `scale=knob` multiplied (or divided) by its factor;
    returns the spec and the paths it changed."""
    touched: list[str] = []
    for knob, factor in factors.items():
        if knob not in SCALES:
            raise CapError(f"{root}.scale.{knob}", factor, "choose one of " + ", ".join(SCALES))
        if factor != 1.0:
            spec = _scale_tree(spec, knob, factor, "", touched)
    return spec, touched


def apply_overrides(spec: Any, overrides: Mapping[str, Any], root: str = "device") -> Any:
    """`spec` with `<root>.<path>` overrides set, then the `scale.*` knobs applied; every
    changed field's source says so (`mpiemu devices NAME --set ...` shows them)."""
    sources = dict(spec.sources)
    knobs: dict[str, float] = {}
    for path, value in overrides.items():
        if path.split(".")[0] == "scale":
            check_path(type(spec), path, value, root)
            knobs[path.split(".")[1]] = float(value)
            continue
        spec = set_path(spec, path, value, root)
        name = ".".join(p for p, _ in _resolved(type(spec), path.split(".")))
        sources[name] = f"OVERRIDE {root}.{path}={value!r} (preset: {sources.get(name, '-')})"
    if knobs:
        record = replace(spec.scale, **knobs)
        spec, touched = scaled(spec, root, **knobs)
        for p in touched:
            knob = next(k for k in knobs if _field_at(type(spec), p).metadata.get("scale") == k)
            value = getattr(spec, p) if "." not in p else None
            for q in ([f"{p}.{e}" for e in value] if isinstance(value, Mapping) else [p]):
                sources[q] = (f"SCALED x{knobs[knob]:g} by {root}.scale.{knob} "
                              f"({sources.get(q, '-')})")
        for knob, factor in knobs.items():
            sources[f"scale.{knob}"] = f"OVERRIDE {root}.scale.{knob}={factor:g}"
        spec = replace(spec, scale=record)
    return replace(spec, sources=sources)


def _resolved(cls: type, segs: list[str]) -> list[tuple[str, float]]:
    """The field names (and unit factors) a dotted override path walks through."""
    out: list[tuple[str, float]] = []
    for i, seg in enumerate(segs):
        if cls is None or not dataclasses.is_dataclass(cls):
            out.append((seg, 1.0))         # a Mapping entry
            continue
        name, factor = resolve_key(cls, seg, seg)
        out.append((name, factor))
        cls = spec_type(_hints(cls)[name])  # type: ignore[assignment]
    return out


def _field_at(cls: type, path: str) -> dataclasses.Field[Any]:
    """The dataclass field at a dotted path (Mapping entries resolve to their field)."""
    f: dataclasses.Field[Any] | None = None
    for seg in path.split("."):
        if cls is None:
            break
        f = next(x for x in fields(cls) if x.name == seg)  # type: ignore[arg-type]
        cls = spec_type(_hints(cls)[seg])  # type: ignore[assignment]
    assert f is not None
    return f


# --- provenance -----------------------------------------------------------------------------
def walk(spec: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, value) of every capability, nested specs expanded."""
    for f in cap_fields(type(spec)):
        v = getattr(spec, f.name)
        if dataclasses.is_dataclass(v):
            yield from walk(v, f"{path}{f.name}.")
        elif isinstance(v, Mapping):
            for k, x in v.items():
                yield f"{path}{f.name}.{k}", x
        elif v is not None:
            yield path + f.name, v

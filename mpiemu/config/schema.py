"""TOML tables -> frozen dataclasses, with unknown keys and wrong types rejected by name."""
from __future__ import annotations

import dataclasses
import difflib
import math
import re
import tomllib
import types
import typing
from typing import Any, Mapping, TypeVar

from .errors import ConfigError

T = TypeVar("T")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB|KB|MB|GB)?\s*$")
_SIZE_SCALE = {None: 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "KB": 10**3,
               "MB": 10**6, "GB": 10**9}


def parse_size(field: str, value: Any) -> int:
    """Bytes from an int or a string such as '64MiB'."""
    if isinstance(value, bool):
        raise ConfigError(field, value, "a size in bytes such as 1024 or '64MiB'")
    if isinstance(value, int):
        return value
    m = _SIZE.match(str(value))
    if not m:
        raise ConfigError(field, value, "a size in bytes such as 1024 or '64MiB'")
    return int(float(m.group(1)) * _SIZE_SCALE[m.group(2)])


def _coerce(tp: Any, value: Any, field: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for alt in typing.get_args(tp):
            try:
                return _coerce(alt, value, field)
            except ConfigError:
                continue
        names = " or ".join(getattr(a, "__name__", str(a)) for a in typing.get_args(tp))
        raise ConfigError(field, value, f"a {names}")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(field, value, "a table")
        return from_table(tp, value, field)  # type: ignore[arg-type]
    if origin is tuple:
        (inner, *_) = typing.get_args(tp)
        items = value if isinstance(value, (list, tuple)) else [value]
        return tuple(_coerce(inner, v, f"{field}[{i}]") for i, v in enumerate(items))
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(field, value, "true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(field, value, "an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(field, value, "a number")
        if not math.isfinite(value):
            raise ConfigError(field, value, "a finite number (not nan or inf)")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(field, value, "a string")
        return value
    return value


def from_table(cls: type[T], table: Mapping[str, Any], prefix: str) -> T:
    """Build dataclass `cls` from a TOML table; every key must be a field of `cls`."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    for key in table:
        if key not in names:
            where = f"{prefix}.{key}" if prefix else key
            raise ConfigError(where, table[key], f"unknown key; allowed keys here: "
                              f"{', '.join(names)}")
    kwargs = {k: _coerce(hints[k], v, f"{prefix}.{k}" if prefix else k)
              for k, v in table.items()}
    return cls(**kwargs)


def parse_override(item: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (['a', 'b', 'c'], value); the value is read as TOML, else a string."""
    if "=" not in item:
        raise ConfigError("--set", item, "key=value with a dotted key, e.g. parallel.tp=2")
    key, raw = item.split("=", 1)
    path = key.strip().split(".")
    if not all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", p) for p in path):
        raise ConfigError("--set", item, "key=value with a dotted key of names, e.g. "
                          "parallel.tp=2")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return path, value


def apply_override(table: dict[str, Any], path: list[str], value: Any) -> None:
    """Set a dotted key inside nested dicts (creating tables as needed)."""
    node = table
    for part in path[:-1]:
        nxt = node.setdefault(part, {})
        if not isinstance(nxt, dict):
            raise ConfigError(".".join(path), value, f"{part} is not a table")
        node = nxt
    node[path[-1]] = value


def as_table(obj: Any) -> Any:
    """A dataclass tree back to plain TOML-like data (for the manifest)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: as_table(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple):
        return [as_table(v) for v in obj]
    return obj


def dotted_keys(cls: type, prefix: str = "") -> list[str]:
    """Every leaf key of a (nested) config dataclass, dotted: `run.iterations`, ..."""
    hints = typing.get_type_hints(cls)
    out: list[str] = []
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out += dotted_keys(tp, f"{prefix}{f.name}.")       # type: ignore[arg-type]
        else:
            out.append(prefix + f.name)
    return out


def did_you_mean(key: str, keys: list[str]) -> list[str]:
    """Keys a misplaced or misspelled `key` may have meant: the same name in another section
    first, then close spellings (difflib)."""
    last = key.split(".")[-1]
    same = [k for k in keys if k.split(".")[-1] == last and k != key]
    close = difflib.get_close_matches(key, keys, n=3, cutoff=0.75)
    return list(dict.fromkeys(same + close))[:3]

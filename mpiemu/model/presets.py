"""Model presets: TOML data files where every number carries its source.

An entry is written `hidden = { value = 12288, source = "GPT-3 paper Table 2.1" }`; a source
starting with "ASSUMPTION" marks a value no paper states. `[model]` holds the architecture,
`[setup]` the inputs of one iteration (sequence length, global batch), `[moe]` the experts
(`model.moe.config.MoeConfig`), `[not_modelled]` what the model has that mpiemu does not
express (listed with its numbers and sources, never read).
"""
from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..devices.presets import bundled_names, read_once_if_bundled
from .config import ModelConfig
from .moe.config import MoeConfig

SETUP_KEYS = ("seq_len", "global_batch")


class ModelPresetError(ValueError):
    """A model preset is missing, malformed or has an unsourced number."""


@dataclass(frozen=True)
class ModelPreset:
    """A model, the inputs it was studied with, and where each number comes from."""

    config: ModelConfig
    global_batch: int
    description: str
    sources: Mapping[str, str]


def _preset_dir() -> Path:
    return Path(__file__).with_name("presets")   # files on disk (importlib.resources: +1 MB/rank)


def list_model_presets() -> list[str]:
    """Names of the bundled model presets."""
    return list(bundled_names(_preset_dir()))


def preset_path(name_or_path: str) -> Path:
    """The file of a bundled preset name, or a path to a preset .toml."""
    path = Path(name_or_path)
    if name_or_path in list_model_presets():
        path = _preset_dir() / f"{name_or_path}.toml"
    if not path.exists():
        raise ModelPresetError(f"model.preset={name_or_path!r} is not a preset; choose one of "
                               f"{list_model_presets()} or give a path to a preset .toml")
    return path


def _entries(section: Mapping[str, Any], where: str) -> dict[str, tuple[Any, str]]:
    out = {}
    for key, entry in section.items():
        if not isinstance(entry, dict) or "value" not in entry \
                or not str(entry.get("source", "")).strip():
            raise ModelPresetError(f"{where}.{key}: every entry needs a value and a source")
        out[key] = (entry["value"], str(entry["source"]))
    return out


def load_model_preset(name_or_path: str) -> ModelPreset:
    """Read and validate a model preset; raises ModelPresetError naming what is wrong. A
    bundled preset is read once per process (validation asks for it about 20 times); a
    file, at every call."""
    return _load_model_preset(name_or_path)


def _read_model_preset(name_or_path: str) -> ModelPreset:
    path = preset_path(name_or_path)
    with path.open("rb") as f:
        raw = tomllib.load(f)
    name = str(raw.get("name", path.stem))
    model = _entries(raw.get("model", {}), f"{name}.model")
    setup = _entries(raw.get("setup", {}), f"{name}.setup")
    moe = _entries(raw.get("moe", {}), f"{name}.moe")
    _entries(raw.get("not_modelled", {}), f"{name}.not_modelled")
    fields = {f.name for f in dataclasses.fields(ModelConfig)} - {"moe"}
    unknown = (set(model) - fields) | (set(setup) - set(SETUP_KEYS)) | \
        {f"moe.{k}" for k in set(moe) - {f.name for f in dataclasses.fields(MoeConfig)}} | \
        set(raw) - {"name", "description", "model", "setup", "moe", "not_modelled"}
    if unknown:
        raise ModelPresetError(f"{name}: unknown keys {sorted(unknown)}")
    missing = [k for k in SETUP_KEYS if k not in setup]
    if missing:
        raise ModelPresetError(f"{name}.setup: missing {missing}")
    kwargs: dict[str, Any] = {k: v for k, (v, _) in model.items()}
    try:
        if moe:
            kwargs["moe"] = MoeConfig(**{k: v for k, (v, _) in moe.items()})
        cfg = ModelConfig(name=name, seq_len=_setup_int(setup, "seq_len"), **kwargs)
        batch = _setup_int(setup, "global_batch")
    except (TypeError, ValueError, OverflowError) as exc:
        raise ModelPresetError(f"{name}: {exc}") from None
    sources = {**{f"model.{k}": s for k, (_, s) in model.items()},
               **{f"setup.{k}": s for k, (_, s) in setup.items()},
               **{f"moe.{k}": s for k, (_, s) in moe.items()}}
    return ModelPreset(cfg, batch, str(raw.get("description", "")), sources)


def _setup_int(setup: dict[str, Any], key: str) -> int:
    """A [setup] value that must be a whole number (a float one with no fraction allowed)."""
    v = setup[key][0]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v):
        raise ValueError(f"setup.{key}={v!r}: must be a whole number")
    return int(v)


_load_model_preset = read_once_if_bundled(_read_model_preset, _preset_dir())

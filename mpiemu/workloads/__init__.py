"""The bundled workloads: TOML files shipped with the package (`mpiemu workloads` lists and
copies them; the repository's `workloads/` is this folder)."""
from __future__ import annotations

from pathlib import Path

DIR = Path(__file__).resolve().parent


def bundled() -> list[Path]:
    """Every bundled workload file, by name."""
    return sorted(DIR.glob("*.toml"))


def describe(path: Path) -> str:
    """A workload's first comment line (what it is), or its name."""
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").strip()
    return path.stem

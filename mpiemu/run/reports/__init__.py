"""Reports that regenerate `results/<name>/` from the project's own models and runs.

Each module has `main(out_dir: Path, argv: list[str]) -> int` and is run by
`mpiemu report NAME [--out DIR] [-- extra args]`.
"""
from __future__ import annotations

import importlib
from pathlib import Path

REPORTS: dict[str, str] = {
    "t3": "mpiemu.run.reports.t3",
    "sunway": "mpiemu.run.reports.sunway",
}


def run_report(name: str, out: Path | None, argv: list[str]) -> int:
    if name not in REPORTS:
        raise ValueError(f"report={name!r}; choose one of {sorted(REPORTS)}")
    module = importlib.import_module(REPORTS[name])
    return int(module.main(out or Path("results") / name, argv))

"""Every emulated event time of six small runs (a pipeline schedule and a folded run among
them) equals its golden file, numerics on or off
(tests/golden_timelines.py; `make goldens` regenerates after an intended change)."""
from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from tests.golden_timelines import CASES, read_golden, run_case, timeline

NUMERICS_TOO = {"quickstart": ["run.numerics=on"], "collectives": ["run.numerics=on"],
                "pipeline": ["run.numerics=on"]}


def _diff(name: str, got: list[str]) -> str:
    lines = list(difflib.unified_diff(read_golden(name), got, f"tests/golden/{name}.csv.gz",
                                      "this run", n=0, lineterm=""))
    more = f"\n... {len(lines) - 40} more lines" if len(lines) > 40 else ""
    return "\n".join(lines[:40]) + more + "\n(intended? `make goldens` and commit)"


@pytest.mark.parametrize("name", sorted(CASES))
def test_timeline_equals_its_golden(name: str, tmp_path: Path) -> None:
    got = timeline(run_case(name, tmp_path / "a"))
    assert got == read_golden(name), _diff(name, got)


@pytest.mark.parametrize("name", sorted(NUMERICS_TOO))
def test_real_numerics_give_the_same_timeline(name: str, tmp_path: Path) -> None:
    """Determinism: payload on or off, the emulated times are bit-identical."""
    got = timeline(run_case(name, tmp_path / "b", NUMERICS_TOO[name]))
    assert got == read_golden(name), _diff(name, got)

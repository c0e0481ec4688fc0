"""docs/api.md's examples run as written, on a quickstart run of their own."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_mpi


def blocks() -> list[str]:
    text = (ROOT / "docs" / "api.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, re.S)


def test_the_api_page_has_examples() -> None:
    assert len(blocks()) >= 3


def test_the_api_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pandas")
    res = run_mpi(4, ["run", "workloads/quickstart.toml", "--set", "run.iterations=2",
                      "--out", str(tmp_path / "runs" / "quickstart")])
    assert res.returncode == 0, res.stderr
    monkeypatch.chdir(tmp_path)
    scope: dict[str, object] = {}
    for code in blocks():          # one namespace: later blocks use earlier names
        exec(compile(code, "docs/api.md", "exec"), scope)      # noqa: S102

"""Damaged run directories: every analysis command refuses in one line naming the file, or
with --allow-incomplete analyses what is sound and says what it left out; no traceback."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import h5py
import numpy as np
import pytest

from tests.conftest import our_lines, run_mpi

COMMANDS = [["analyze"], ["export", "--chrome", "{tmp}/t.json"], ["plot", "--out", "{tmp}/t.png"]]


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("good") / "run"
    res = run_mpi(2, ["run", "workloads/collectives.toml", "--set", "parallel.tp=2", "--set",
                      "collectives.sizes=['4KiB']", "--set", "run.numerics=off", "--out",
                      str(out)])
    assert res.returncode == 0, res.stderr
    return out


def _truncate(d: Path) -> None:
    f = d / "rank-00001.h5"
    f.write_bytes(f.read_bytes()[:300])


def _zero(d: Path) -> None:
    f = d / "rank-00001.h5"
    f.write_bytes(b"\0" * f.stat().st_size)


def _delete(d: Path) -> None:
    (d / "rank-00001.h5").unlink()


def _nan(d: Path) -> None:
    with h5py.File(d / "rank-00001.h5", "r+") as f:
        ev = f["events"][()]
        ev["t_end"][0] = np.nan
        f["events"][...] = ev


def _manifest(d: Path) -> None:
    (d / "manifest.json").write_text("{not json")


def _no_events(d: Path) -> None:
    with h5py.File(d / "rank-00001.h5", "r+") as f:
        del f["events"]


DAMAGE: dict[str, Callable[[Path], None]] = {
    "truncated": _truncate, "zeroed": _zero, "deleted": _delete, "nan": _nan,
    "manifest": _manifest, "no-events": _no_events}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_run_is_one_line_or_analysed_with_a_note(good: Path, tmp_path: Path,
                                                         damage: str) -> None:
    d = tmp_path / "run"
    shutil.copytree(good, d)
    (d / "trace.h5").unlink(missing_ok=True)
    DAMAGE[damage](d)
    for cmd in COMMANDS:
        args = [a.format(tmp=tmp_path) for a in cmd]
        res = run_mpi(1, [args[0], str(d), *args[1:]], timeout=60)
        lines = our_lines(res.stderr)
        assert res.returncode != 0 and len(lines) == 1, (cmd, res.stderr)
        assert "Traceback" not in res.stderr and str(d) in lines[0], lines
        ok = run_mpi(1, [args[0], str(d), *args[1:], "--allow-incomplete"], timeout=60)
        assert ok.returncode == 0, (cmd, ok.stderr)
        assert "note: left out" in ok.stderr and "Traceback" not in ok.stderr


def test_a_sound_run_has_no_notes(good: Path) -> None:
    res = run_mpi(1, ["analyze", str(good)])
    assert res.returncode == 0 and "note" not in res.stderr
    assert json.loads((good / "manifest.json").read_text())["status"] == "complete"

"""A real full disk (a private 6 MiB tmpfs, `unshare -m`): the job ends with one line per
failing rank naming the file and ENOSPC, the manifest says `failed`, and every event block
committed before the disk filled reads back (sim/trace.py: only the block being written is
lost, and its partial file is removed so the manifest can still be written)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import pytest

from mpiemu.analysis import load
from mpiemu.sim.trace import part_files, rank_file
from tests.conftest import ROOT, child_env, mpiexec_path

SIZE = "6m"


def _namespace() -> list[str]:
    """A private mount namespace: as root directly, else through a user namespace."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1): cannot mount a private tmpfs")
    cmd = ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-rm"]
    probe = subprocess.run([*cmd, "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a private tmpfs here: {probe.stderr.strip()[:120]}")
    return cmd


def test_a_full_disk_fails_the_job_in_one_line_and_keeps_every_committed_block(
        tmp_path: Path) -> None:
    disk, kept = tmp_path / "disk", tmp_path / "kept"
    disk.mkdir()
    job = [mpiexec_path(), "-n", "2", sys.executable, "-m", "mpiemu", "run",
           "workloads/quickstart.toml", "--set", "parallel.tp=2", "--set", "parallel.dp=1",
           "--set", "run.numerics=off", "--set", "train.check_reference=false",
           "--set", "run.iterations=100000", "--out", f"{disk}/run"]
    script = (f"mount -t tmpfs -o size={SIZE} tmpfs {disk} && "
              f"{subprocess.list2cmdline(job)}; rc=$?; cp -a {disk}/run {kept}; exit $rc")
    res = subprocess.run([*_namespace(), "sh", "-c", script], capture_output=True, text=True,
                         env=child_env(MPIEXEC_TIMEOUT="120"), cwd=ROOT, timeout=180)
    assert res.returncode not in (0, 2), res.stderr[-1500:]
    said = [ln for ln in res.stderr.splitlines() if ln.startswith("mpiemu: rank")]
    full = [ln for ln in said if "OSError: [Errno 28] cannot write" in ln
            and "No space left on device" in ln and "Can't" not in ln]
    # the others either hit the full disk too or were stopped after (Open MPI's mpirun)
    assert full and all(ln in full or "had died" in ln for ln in said), res.stderr[-1500:]
    run = load(kept, allow_incomplete=True)
    assert run.manifest["status"] == "failed" and run.manifest["failed_rank"] in (0, 1)
    for rt in run.ranks:
        parts = part_files(rank_file(kept, rt.rank))
        assert len(parts) >= 2 and not list(kept.glob("*.tmp"))
        committed = 0
        for _, p in parts:                 # every committed block opens, whole
            with h5py.File(p, "r") as f:
                committed += len(f["events"])
        assert len(rt.events) == committed, (rt.rank, len(rt.events), committed)

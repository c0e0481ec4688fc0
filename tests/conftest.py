"""Shared fixtures: a timed communicator over COMM_WORLD without a trace file."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def mpiexec_path() -> str:
    """The launcher that belongs to this environment's MPI (venv bin first)."""
    local = BIN / "mpiexec"
    return str(local) if local.exists() else (shutil.which("mpiexec") or "mpiexec")


def child_env(**extra: str) -> dict[str, str]:
    """This environment minus the launcher's variables, so a child starts its own MPI job
    even when the test itself runs under mpiexec."""
    drop = ("PMI_", "PMIX_", "HYDRA_", "MPI_LOCAL", "MPICH_", "OMPI_", "PRTE_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", **extra)
    return env


def run_mpi(n: int, args: list[str], timeout: float = 120, cwd: Path | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Launch `python -m mpiemu ARGS` on n ranks and capture its output."""
    full_env = child_env(MPIEXEC_TIMEOUT=str(int(timeout)), **(env or {}))
    cmd = [mpiexec_path(), "-n", str(n), sys.executable, "-m", "mpiemu", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 30,
                          cwd=cwd or ROOT, env=full_env)


@pytest.fixture
def root() -> Path:
    return ROOT

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

# Under mpiexec every rank runs pytest: only rank 0 reports, unless a rank fails (then its
# whole report follows on stderr). MPICH's and Open MPI's launchers say which rank we are.
MPI_RANK = int(os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or 0)
# Each rank's pytest keeps its temporary directories under a root of its own: ranks sharing
# /tmp/pytest-of-USER race in pytest's clean-up of old numbered directories at exit
# (FileNotFoundError on `pytest-current`, then MPI_Abort of a passing job).
if int(os.environ.get("PMI_SIZE") or os.environ.get("OMPI_COMM_WORLD_SIZE") or 1) > 1:
    import tempfile
    _root = Path(tempfile.gettempdir()) / f"mpiemu-pytest-rank{MPI_RANK}"
    _root.mkdir(exist_ok=True)
    os.environ["PYTEST_DEBUG_TEMPROOT"] = str(_root)


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    expect = os.environ.get("MPIEMU_EXPECT_RANKS")
    if expect:                  # `make test-mpi`: a launcher / mpi4py mismatch runs N singletons
        from mpi4py import MPI
        if MPI.COMM_WORLD.Get_size() != int(expect):
            raise pytest.UsageError(
                f"MPI tests asked for {expect} ranks but this process is one of "
                f"{MPI.COMM_WORLD.Get_size()}: mpiexec and mpi4py belong to different MPIs "
                "(make install-site-mpi, or the wheel's .venv/bin/mpiexec)")
    if MPI_RANK > 0:
        import io
        config._mpiemu_report = io.StringIO()  # type: ignore[attr-defined]
        tr = config.pluginmanager.get_plugin("terminalreporter")
        if tr is not None:
            tr._tw = _pytest_terminal_writer(config._mpiemu_report)  # type: ignore[attr-defined]


def _pytest_terminal_writer(buf: object) -> object:
    from _pytest._io import TerminalWriter
    return TerminalWriter(file=buf)  # type: ignore[arg-type]


def pytest_unconfigure(config: pytest.Config) -> None:
    buf = getattr(config, "_mpiemu_report", None)
    if buf is not None and getattr(config, "_mpiemu_failed", False):
        sys.stderr.write(f"--- rank {MPI_RANK} ---\n{buf.getvalue()}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config._mpiemu_failed = exitstatus not in (0, 5)  # type: ignore[attr-defined]


def mpiexec_path() -> str:
    """The launcher that belongs to this environment's MPI (venv bin first)."""
    local = BIN / "mpiexec"
    return str(local) if local.exists() else (shutil.which("mpiexec") or "mpiexec")


def child_env(**extra: str) -> dict[str, str]:
    """This environment minus the launcher's variables, so a child starts its own MPI job
    even when the test itself runs under mpiexec."""
    from mpiemu._proc import launcher_free_env
    return launcher_free_env(**extra)


def our_lines(stderr: str) -> list[str]:
    """mpiemu's own stderr lines (launchers add banners of their own: Open MPI's prterun
    reports every non-zero exit; MPICH prints `Abort(...)`)."""
    return [ln for ln in stderr.splitlines() if ln.startswith("mpiemu")]


def run_mpi(n: int, args: list[str], timeout: float = 120, cwd: Path | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Launch `python -m mpiemu ARGS` on n ranks and capture its output."""
    full_env = child_env(MPIEXEC_TIMEOUT=str(int(timeout)), **(env or {}))
    cmd = [mpiexec_path(), "-n", str(n), sys.executable, "-m", "mpiemu", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 30,
                          cwd=cwd or ROOT, env=full_env)


def run_quickstart(out: Path, iterations: int, *sets: str) -> Path:
    """The quickstart at TP 2 on two ranks (DP 1) for `iterations`, with `--set` overrides,
    into `out` (it must run)."""
    res = run_mpi(2, ["run", "workloads/quickstart.toml", "--set", "parallel.tp=2", "--set",
                      "parallel.dp=1", "--set", f"run.iterations={iterations}",
                      *(a for s in sets for a in ("--set", s)), "--out", str(out)])
    assert res.returncode == 0, res.stderr
    return out


@pytest.fixture
def root() -> Path:
    return ROOT

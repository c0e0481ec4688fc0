"""Launching emulated runs for a study: `mpiexec -n N mpiemu run W.toml --set ...`.

A study's figures are runs of the emulator itself (not formulas): this starts them the way a
user would, in a clean environment (no launcher variables leak in when a study runs under
mpiexec itself), one BLAS thread per rank.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from .._proc import launcher_free_env
from .common import ROOT


def mpiexec() -> str:
    """The mpiexec beside this Python (the venv's MPICH), else the one on PATH."""
    local = Path(sys.executable).parent / "mpiexec"
    return str(local) if local.exists() else (shutil.which("mpiexec") or "mpiexec")


def child_env(timeout: int) -> dict[str, str]:
    """This environment minus any launcher's variables (we may run under mpiexec ourselves)."""
    return launcher_free_env(MPIEXEC_TIMEOUT=str(timeout))


def run(ranks: int, workload: Path | str, sets: Sequence[str], out: Path,
        timeout: int = 1200) -> str:
    """`mpiexec -n ranks mpiemu run workload --set ... --out out`; its stdout. Raises with the
    run's last lines when it fails."""
    cmd = [mpiexec(), "-n", str(ranks), sys.executable, "-m", "mpiemu", "run", str(workload),
           "--out", str(out)]
    for item in sets:
        cmd += ["--set", item]
    res = subprocess.run(cmd, capture_output=True, text=True, env=child_env(timeout),
                         timeout=timeout + 60, cwd=ROOT)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[4:])} failed ({res.returncode}): "
                           f"{(res.stderr or res.stdout).strip()[-2000:]}")
    return res.stdout


def processes(workload: Path | str, sets: Sequence[str], gpus: int) -> int:
    """MPI processes for an emulated job of `gpus` GPUs: one per pipeline stage (per CP
    rank of each stage with context parallelism) when it folds exactly (`run.fold`:
    bit-identical emulated times), else one per GPU."""
    from ..config.workload import load_workload  # noqa: PLC0415
    from ..config.errors import ConfigError  # noqa: PLC0415
    from ..runner.fold_plan import plan_fold  # noqa: PLC0415
    w = load_workload(str(workload), list(sets))
    launch = w.parallel.cp * w.parallel.pp
    if launch >= gpus:
        return gpus
    try:
        return launch if plan_fold(w, launch) is not None else gpus
    except ConfigError:
        return gpus

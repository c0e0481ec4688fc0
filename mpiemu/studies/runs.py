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
from typing import TYPE_CHECKING, Sequence

from .._proc import launcher_free_env
from .common import ROOT

if TYPE_CHECKING:
    from ..config.workload import Workload


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
           "--out", str(out), "--force"]
    for item in sets:
        cmd += ["--set", item]
    res = subprocess.run(cmd, capture_output=True, text=True, env=child_env(timeout),
                         timeout=timeout + 60, cwd=ROOT)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[4:])} failed ({res.returncode}): "
                           f"{(res.stderr or res.stdout).strip()[-2000:]}")
    return res.stdout


def processes(workload: Path | str, sets: Sequence[str], gpus: int) -> int:
    """MPI processes for an emulated job of `gpus` GPUs: one per class of exact images
    when it folds (`run.fold`: bit-identical emulated times), else one per GPU."""
    from ..config.workload import load_workload  # noqa: PLC0415
    from ..config.errors import ConfigError  # noqa: PLC0415
    try:
        return fold_processes(load_workload(str(workload), list(sets)), gpus)[0]
    except ConfigError:
        return gpus


def fold_processes(w: "Workload", gpus: int) -> tuple[int, str]:
    """The processes a valid workload of `gpus` GPUs runs on (one per class of exact
    images where it folds), and why it does not fold ('' if it does, or needs not)."""
    from ..runner.fold_plan import classes, obstacle  # noqa: PLC0415
    why = obstacle(w)
    if why is not None:
        return gpus, why
    fold = classes(w)[0]
    if fold.launch >= gpus:
        return gpus, f"no two emulated GPUs are exact images ({fold.why})"
    return fold.launch, ""

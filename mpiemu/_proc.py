"""Processes we start or watch: an environment without a launcher's variables, and whether a
pid still runs (light: no MPI, no numpy)."""
from __future__ import annotations

import os
from pathlib import Path

_LAUNCHER = ("PMI_", "PMIX_", "HYDRA_", "MPI_LOCAL", "MPICH_", "OMPI_", "PRTE_")
_USERS_OWN = ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM",   # launcher settings
              "PRTE_MCA_rmaps_default_mapping_policy")                     # the user chose


def launcher_free_env(**extra: str) -> dict[str, str]:
    """This environment minus the launcher's variables (a child starts its own MPI job, or
    none, even when we run under mpiexec), one BLAS thread, plus `extra`."""
    env = {k: v for k, v in os.environ.items()
           if k in _USERS_OWN or not k.startswith(_LAUNCHER)}
    env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", **extra)
    return env


def alive(pid: int) -> bool:
    """The process runs (a zombie, killed but not yet reaped by its parent, does not; a pid
    of someone else's process counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True

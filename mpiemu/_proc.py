"""Processes we start or watch: an environment without a launcher's variables, and whether a
pid still runs (light: no MPI, no numpy)."""
from __future__ import annotations

import os
from pathlib import Path

_LAUNCHER = ("PMI_", "PMIX_", "HYDRA_", "MPI_LOCAL", "MPICH_", "OMPI_", "PRTE_")
# The user's own MPI settings pass through: Open MPI / PRRTE / PMIx MCA parameters and the
# run-as-root pair; not the parameters a launcher sets for the processes it starts (Open MPI
# 4's mpirun: ess, orte_*, pmix, initial_wdir, mpi_oversubscribe, shmem_*; Open MPI 5's prte).
_USERS_OWN = ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_MCA_", "PRTE_MCA_", "PMIX_MCA_")
_SET_BY_LAUNCHER = ("ess", "orte_", "prte_", "pmix", "initial_wdir", "mpi_oversubscribe",
                    "shmem_", "mca_base_component_show_load_errors")


def _users_own(name: str) -> bool:
    """An MPI setting the user made (kept for child jobs), not one its launcher made."""
    if not name.startswith(_USERS_OWN):
        return False
    param = name.split("_MCA_", 1)[1] if "_MCA_" in name else ""
    return not param.startswith(_SET_BY_LAUNCHER)


def launcher_free_env(**extra: str) -> dict[str, str]:
    """This environment minus the launcher's variables (a child starts its own MPI job, or
    none, even when we run under mpiexec), one BLAS thread, plus `extra`."""
    env = {k: v for k, v in os.environ.items()
           if _users_own(k) or not k.startswith(_LAUNCHER)}
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


def launcher_stderr(launcher_pid: int) -> int | None:
    """A descriptor on the stderr of MPICH's hydra proxy (a rank's parent), which is the
    user's own: a line written there needs no forwarding, which the proxy may skip when the
    job aborts at once. None for other launchers (Open MPI's daemons, slurmstepd keep theirs
    in logs)."""
    try:
        if Path(f"/proc/{launcher_pid}/comm").read_text().strip() != "hydra_pmi_proxy":
            return None
        return os.open(f"/proc/{launcher_pid}/fd/2", os.O_WRONLY | os.O_APPEND | os.O_NOCTTY)
    except OSError:
        return None

"""Processes we start or watch: an environment without a launcher's variables, whether a
pid still runs, and when a rank collects its garbage (light: no MPI, no numpy)."""
from __future__ import annotations

import gc
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


def manual_gc() -> None:
    """Turn Python's automatic garbage collection off for the rest of this process (the
    `mpiemu` command's ranks); `collect_garbage` then runs at the end of each iteration.

    Triggered by allocation counts, the collector ran about 90 times per rank in an 8-rank
    timing-only GPT-3 175B iteration, 12 ms of CPU per rank (measured), wherever the counts
    happened to fall, mostly while the rank's peers waited for its next message. Megatron-LM
    does the same for the same reason (`--manual-gc`, `--manual-gc-interval`,
    megatron/training/arguments.py)."""
    gc.disable()


def set_aside() -> None:
    """With automatic collection off (`manual_gc`): set what the process holds now aside
    from every later collection (`gc.freeze`: the modules, the configuration, the presets,
    which live for the run), so that a collection scans only what the run made since."""
    if not gc.isenabled():
        gc.freeze()


def collect_garbage() -> None:
    """The end of an iteration: with automatic collection off (`manual_gc`), collect the
    cyclic garbage made since the last collection, then set the survivors aside
    (`set_aside`). With automatic collection on (a test calling `main` in-process), nothing:
    Python's own policy stays."""
    if gc.isenabled():
        return
    gc.collect()
    set_aside()

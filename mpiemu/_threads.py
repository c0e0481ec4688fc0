"""Cores for ranks that outnumber them: one BLAS thread per rank (set before numpy loads
BLAS), and, for `mpiemu run`, each rank on a core of its own choosing (`pin_rank`); on one
node, UCX started without its memory hooks (set before MPI loads: `skip_ucx_memory_hooks`)."""
from __future__ import annotations

import os

_RANK_COUNT_VARS = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPICH_LOCALNRANKS",
                    "SLURM_NTASKS_PER_NODE", "PMI_SIZE")
_LOCAL_COUNT_VARS = _RANK_COUNT_VARS[:-1]       # what a launcher says of this node alone
_WORLD_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS")
_LOCAL_RANK_VARS = ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPICH_LOCALRANKID",
                    "SLURM_LOCALID")
_BLAS_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
              "BLIS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")


def _launcher_int(names: tuple[str, ...]) -> int | None:
    """The first of the launchers' variables `names` that holds a count (Slurm may append
    a repeat, as in `8(x2)`), or None."""
    for var in names:
        value = os.environ.get(var, "").split("(")[0]
        if value.isdigit():
            return int(value)
    return None


def local_ranks() -> int:
    """How many ranks the launcher put on this node (1 when not under a launcher)."""
    return _launcher_int(_RANK_COUNT_VARS) or 1


def oversubscribed() -> bool:
    """More ranks on this node than cores this process may use."""
    return local_ranks() > len(os.sched_getaffinity(0))


def one_node() -> bool:
    """The launcher says every rank of the job is on this node."""
    local = _launcher_int(_LOCAL_COUNT_VARS)
    return local is not None and local == _launcher_int(_WORLD_SIZE_VARS)


def skip_ucx_memory_hooks() -> None:
    """When every rank is on this node, start UCX with `UCX_MEM_EVENTS=no` unless the user
    set it.

    UCX (a network layer of MPICH's ch4 and of Open MPI) patches the process's memory calls
    as its library loads, so that its cache of RDMA-registered buffers hears of memory given
    back to the system: 10-40 ms of CPU per process before any work. Ranks on one node
    exchange messages through shared memory (MPICH's ch4 shm, Open MPI's sm), never through
    registered RDMA buffers, so there the hooks guard nothing. On the 2-core host of the
    scale benchmark the 8-rank GPT-3 command took 3.5% less wall time with it (median of 10
    alternating runs) and 0.13 CPU-s less. Emulated time does not depend on it."""
    if "UCX_MEM_EVENTS" not in os.environ and one_node():
        os.environ["UCX_MEM_EVENTS"] = "no"


def limit_blas_threads() -> None:
    """Give each rank cores // ranks BLAS threads unless the user already chose."""
    if any(v in os.environ for v in _BLAS_VARS):
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    ranks = local_ranks()
    if ranks > 1:
        threads = str(max(1, (cores or 1) // ranks))
        for var in _BLAS_VARS:
            os.environ[var] = threads


def pin_rank() -> None:
    """When a node's ranks outnumber the cores this process may use and the launcher has not
    bound it to one, stay on core `local rank mod cores` (`MPIEMU_PIN=0`: leave it to the OS).

    Consecutive ranks (a TP ring's neighbours, adjacent pipeline stages) then sit on
    different cores, so a message and its answer run side by side, and no rank migrates. On
    this 2-core host an 8-rank ring ran 14% faster (2.55 -> 2.19 s), 16 and 32 ranks 6% and
    3%, a 64-rank pipeline 10% (`benchmarks/scale.py`, README). Emulated time does not
    depend on it."""
    if os.environ.get("MPIEMU_PIN", "") == "0" or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    local = _launcher_int(_LOCAL_RANK_VARS)
    if len(cores) < 2 or not oversubscribed() or local is None:
        return
    os.sched_setaffinity(0, {cores[local % len(cores)]})

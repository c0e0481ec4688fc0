"""One BLAS thread per rank when ranks outnumber cores (set before numpy loads BLAS)."""
from __future__ import annotations

import os

_RANK_COUNT_VARS = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPICH_LOCALNRANKS",
                    "SLURM_NTASKS_PER_NODE", "PMI_SIZE")
_BLAS_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
              "BLIS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")


def local_ranks() -> int:
    """How many ranks the launcher put on this node (1 when not under a launcher)."""
    for var in _RANK_COUNT_VARS:
        value = os.environ.get(var, "")
        if value.split("(")[0].isdigit():
            return int(value.split("(")[0])
    return 1


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

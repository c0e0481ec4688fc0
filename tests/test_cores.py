"""Ranks that outnumber the cores: (`mpiemu run`) a core each."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import child_env

PROBE = "import os; from mpiemu._threads import pin_rank; pin_rank(); " \
        "print(sorted(os.sched_getaffinity(0)))"


def _probe(**env: str) -> str:
    """The cores a fresh process keeps after `pin_rank` under the launcher variables `env`."""
    return subprocess.run([sys.executable, "-c", PROBE],
                          env=child_env(**{"MPIEMU_PIN": "", **env}), check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs at least 2 usable cores")
def test_an_oversubscribed_rank_takes_core_local_rank_mod_cores_unless_told_not_to() -> None:
    cores = sorted(os.sched_getaffinity(0))
    n = len(cores)
    ranks = str(2 * n)
    assert _probe(MPI_LOCALNRANKS=ranks, MPI_LOCALRANKID=str(n + 1)) == f"[{cores[1]}]"
    assert _probe(MPI_LOCALNRANKS=ranks, MPI_LOCALRANKID="0") == f"[{cores[0]}]"
    assert _probe(MPI_LOCALNRANKS=ranks, MPI_LOCALRANKID="1", MPIEMU_PIN="0") == str(cores)
    assert _probe(MPI_LOCALNRANKS=str(n), MPI_LOCALRANKID="1") == str(cores)     # they fit

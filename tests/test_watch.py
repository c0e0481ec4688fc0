"""The watchman's order of deaths and the child environment's MPI settings (runner/watch.py,
_proc.py): units without MPI."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from mpiemu._proc import launcher_free_env
from mpiemu.runner.watch import DYING_NS, _in_order, deaths


def test_a_rank_is_dated_by_its_first_thread_to_end() -> None:
    """The killed rank's main thread ends after a launcher-killed peer's (tearing down its
    memory), but one of its threads ended first: it is named first."""
    exits = {100: [5], 200: []}
    ended = {100: 30, 200: 20}
    assert _in_order(exits, ended, {100: 3, 200: 0}) == [[3], [0]]
    # a thread that ended long before (a pool shrinking) does not date the death
    assert _in_order({100: [30 - 2 * DYING_NS]}, {100: 30, 200: 20},
                     {100: 3, 200: 0}) == [[0], [3]]


def test_deaths_lists_the_first_death_first() -> None:
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
             for _ in range(3)]
    try:
        ranks = {r: p.pid for r, p in enumerate(procs)}
        import threading
        got: list[list[list[int]]] = []
        t = threading.Thread(target=lambda: got.append(deaths(ranks)))
        t.start()
        time.sleep(0.5)
        os.kill(procs[1].pid, signal.SIGKILL)
        time.sleep(0.3)
        for p in (procs[2], procs[0]):
            os.kill(p.pid, signal.SIGKILL)
        for p in procs:
            p.wait()             # reaped: as the launcher does
        t.join(timeout=10)
        assert got and got[0][0] == [1] and sorted(sum(got[0], [])) == [0, 1, 2], got
    finally:
        for p in procs:
            p.kill()


@pytest.mark.parametrize("name, kept", [
    ("OMPI_MCA_rmaps_base_oversubscribe", True), ("OMPI_MCA_btl", True),
    ("PRTE_MCA_rmaps_default_mapping_policy", True), ("OMPI_ALLOW_RUN_AS_ROOT", True),
    ("OMPI_MCA_ess_base_jobid", False), ("OMPI_MCA_orte_hnp_uri", False),
    ("OMPI_MCA_pmix", False), ("OMPI_COMM_WORLD_RANK", False), ("PMIX_RANK", False),
    ("PMI_RANK", False), ("MPIR_CVAR_CH4_NETMOD", True)])
def test_child_jobs_keep_the_users_mpi_settings_not_the_launchers(
        monkeypatch: pytest.MonkeyPatch, name: str, kept: bool) -> None:
    monkeypatch.setenv(name, "1")
    assert (name in launcher_free_env()) == kept

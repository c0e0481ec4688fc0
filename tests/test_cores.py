"""Rank processes: (`mpiemu run`) a core each when ranks outnumber the cores, UCX without
memory hooks when the job is on one node, and garbage collected at iteration ends."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mpiemu._threads import _RANK_COUNT_VARS, _WORLD_SIZE_VARS
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


UCX_PROBE = "import os, mpiemu; print(os.environ.get('UCX_MEM_EVENTS', '-'))"


@pytest.mark.parametrize("env, want", [
    ({"MPI_LOCALNRANKS": "4", "PMI_SIZE": "4"}, "no"),                  # mpiexec, one node
    ({"SLURM_NTASKS_PER_NODE": "8", "SLURM_NTASKS": "8"}, "no"),        # srun, one node
    ({"MPI_LOCALNRANKS": "4", "PMI_SIZE": "8"}, "-"),                   # two nodes
    ({"SLURM_NTASKS": "16"}, "-"),                                      # per node unknown
    ({"PMI_SIZE": "4"}, "-"),
    ({"MPI_LOCALNRANKS": "4", "PMI_SIZE": "4", "UCX_MEM_EVENTS": "yes"}, "yes"),  # the user's
])
def test_ucx_starts_without_memory_hooks_only_when_the_job_is_on_one_node(
        env: dict[str, str], want: str) -> None:
    drop = {*_RANK_COUNT_VARS, *_WORLD_SIZE_VARS, "UCX_MEM_EVENTS"}   # only `env` says
    full = {**{k: v for k, v in child_env().items() if k not in drop}, **env}
    out = subprocess.run([sys.executable, "-c", UCX_PROBE], env=full, check=True,
                         capture_output=True, text=True).stdout.strip()
    assert out == want


GC_PROBE = """
import gc, weakref
from mpiemu._proc import collect_garbage, manual_gc, set_aside
class Node: pass
def cycle():
    a, b = Node(), Node()
    a.b, b.a = b, a
    return weakref.ref(a)
manual_gc()
kept = cycle()          # made before the run opened: set aside with the rest, never scanned
set_aside()
assert not gc.isenabled() and gc.get_freeze_count() > 0
made = cycle()          # an iteration's cyclic garbage
assert made() is not None            # nothing collects it on its own any more
collect_garbage()
assert made() is None                # the iteration's end did
assert kept() is not None            # what was set aside is not scanned again
print("ok")
"""


def test_a_run_collects_garbage_at_iteration_ends_not_on_allocation_counts() -> None:
    out = subprocess.run([sys.executable, "-c", GC_PROBE], env=child_env(), check=True,
                         capture_output=True, text=True).stdout.strip()
    assert out == "ok"


def test_with_automatic_collection_on_an_iteration_end_leaves_python_s_policy() -> None:
    import gc
    from mpiemu._proc import collect_garbage
    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    collect_garbage()
    assert gc.isenabled() and gc.get_freeze_count() == frozen

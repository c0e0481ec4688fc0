"""Test helpers: build timed communicators without a run directory."""
from __future__ import annotations

from mpi4py import MPI

from mpiemu.comm.p2p import TimedComm
from mpiemu.hw import LinkSpec, load_device, model_for
from mpiemu.sim.timeline import Timeline


def timed_comm(comm: MPI.Comm | None = None, preset: str = "t3-gpu",
               link: LinkSpec | None = None, name: str = "tp") -> TimedComm:
    """A TimedComm on `comm` (default COMM_WORLD) with a fresh untraced timeline."""
    comm = MPI.COMM_WORLD if comm is None else comm
    spec = load_device(preset)
    return TimedComm(comm, Timeline(), link or spec.link, model_for(spec), name)

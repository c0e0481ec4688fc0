"""Test helpers: build timed communicators and networks without a run directory."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from mpi4py import MPI

from mpiemu.comm.p2p import TimedComm, Tuning
from mpiemu.comm.ring import Reduction
from mpiemu.devices import load_device, device_cost
from mpiemu.net import Network, NetworkSpec, load_network
from mpiemu.sim.timeline import Timeline


def network(preset: str = "t3-ring", *, bw: float | None = None,
            latency: float | None = None, **fields: Any) -> NetworkSpec:
    """A network preset with its intra-node rate (bytes/s) and every protocol's hop latency
    (s) replaced, and any other NetworkSpec field set."""
    spec = load_network(preset)
    intra = spec.intra
    if bw is not None:
        intra = replace(intra, bw_bytes_per_s=bw)
    if latency is not None:
        intra = replace(intra, latency_s={p: latency for p in intra.latency_s})
    return replace(spec, intra=intra, **fields)


def timed_comm(comm: MPI.Comm | None = None, preset: str = "t3-gpu",
               net: NetworkSpec | None = None, name: str = "tp", algorithm: str = "",
               protocol: str = "") -> TimedComm:
    """A TimedComm on `comm` (default COMM_WORLD) with a fresh untraced timeline, on the
    device preset's network unless `net` is given (`algorithm` / `protocol`: its tuning)."""
    comm = MPI.COMM_WORLD if comm is None else comm
    spec = load_device(preset)
    ns = net if net is not None else load_network(spec.network)
    return TimedComm(comm, Timeline(), Network(ns, MPI.COMM_WORLD.Get_size()), name,
                     tuning=Tuning(algorithm, protocol))


def reducer(preset: str = "t3-gpu") -> Reduction:
    """The device preset's time to reduce (what its rank's collectives are given)."""
    return device_cost(load_device(preset)).reduction_s

"""One rank's view of a run: grid, device cost, timeline, timed communicators, trace, manifest."""
from __future__ import annotations

import datetime as _dt
import json
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import h5py
import numpy as np
from mpi4py import MPI

from .. import __version__
from .._proc import collect_garbage, launcher_free_env, set_aside
from ..comm.shape import Fold
from ..comm.grid import ProcessGrid
from ..comm.p2p import TimedComm, Tuning
from ..devices.cost import DeviceCost, device_cost
from ..devices.specs import DeviceSpec, dtype_bytes
from ..sim.timeline import Timeline
from ..sim.trace import TraceWriter, commit, rank_file, write_merged
from ..config.workload import Workload, resolve_device
from .fold_plan import shape_of
from .mpi import arrive, say
from ..config.schema import as_table


class LogOptions(NamedTuple):
    """What rank 0 prints while a run goes (`mpiemu run --quiet / --log-interval /
    --heartbeat`): nothing of the iterations but the last (quiet), every `interval`-th
    iteration's line (and the last), and within an iteration a progress line every
    `heartbeat_s` seconds of wall time (0: none)."""

    quiet: bool = False
    interval: int = 1
    heartbeat_s: float = 10.0

    def shows(self, it: int, iterations: int) -> bool:
        """Whether iteration `it`'s line is printed."""
        last = it == iterations - 1
        return last or (not self.quiet and it % max(self.interval, 1) == 0)


@dataclass
class RankContext:
    """Everything a workload runner needs on one rank."""

    w: Workload
    world: MPI.Comm
    grid: ProcessGrid
    spec: DeviceSpec
    cost: DeviceCost                # the device this rank plays
    tl: Timeline
    tp: TimedComm
    dp: TimedComm
    out: Path
    writer: TraceWriter
    processes: list[list[Any]]        # [host, pid] per MPI rank
    log: LogOptions = LogOptions()

    @property
    def rank(self) -> int:
        return self.world.Get_rank()

    @property
    def numerics(self) -> bool:
        return self.w.run.numerics == "on"

    @property
    def np_dtype(self) -> type[np.floating[Any]]:
        return np.float64 if self.w.run.numeric_dtype == "fp64" else np.float32

    @property
    def wire_itemsize(self) -> int:
        return dtype_bytes(self.w.run.emulated_dtype)

    def say(self, *lines: str) -> None:
        say(self.world, *lines)

    def end_iteration(self) -> None:
        """An iteration's end: commit the traces if the flush interval passed, and collect
        the iteration's garbage (`_proc.collect_garbage`)."""
        self.writer.tick()
        collect_garbage()

    def maybe_fail(self, point: int) -> None:
        """Injected fault (debug.fail_rank / fail_iteration / fail_at) for testing the job's
        failure behaviour: a raise here, inside this rank's next message (a collective), inside
        a trace flush, or the process killed outright."""
        dbg = self.w.debug
        if self.rank != dbg.fail_rank or point != dbg.fail_iteration:
            return
        if dbg.fail_at == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if dbg.fail_at == "collective":
            self.tl.fault = "collective"        # `TimedComm.post` raises on the next message
            return
        if dbg.fail_at == "flush":
            self.writer.fail_next_flush = True
            self.writer.flush()
        raise RuntimeError(f"injected failure at point {point} (debug.fail_rank)")


def _versions() -> dict[str, str]:
    import mpi4py
    return {"mpiemu": __version__, "numpy": np.__version__, "h5py": h5py.__version__,
            "hdf5": h5py.version.hdf5_version, "mpi4py": mpi4py.__version__,
            "mpi_library": " ".join(MPI.Get_library_version().split()[:3]),
            "python": sys.version.split()[0]}


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def write_manifest(out: Path, data: dict[str, Any]) -> None:
    """Atomically (re)write manifest.json."""
    text = json.dumps(data, indent=2, sort_keys=True, default=str)
    commit(out / "manifest.json", lambda tmp: tmp.write_text(text),
           tmp=out / f"manifest.json.{os.getpid()}.tmp")


def open_run(w: Workload, world: MPI.Comm, out: Path, argv: list[str],
             fold: Fold | None = None, log: LogOptions = LogOptions()) -> RankContext:
    """Collective: build the grid, create the run directory, manifest and rank trace files
    (`fold`: one MPI rank per stage, each file standing for its stage's images)."""
    shape = shape_of(w)
    grid = ProcessGrid(world, shape, fold)
    spec = resolve_device(w, grid.rank)
    hosts = world.allgather(socket.gethostname())
    # the real placement when it spans hosts; a folded job's processes are not its GPUs
    net = w.network_of(shape.size, () if fold else hosts)
    processes = world.allgather([hosts[world.Get_rank()], os.getpid()])
    stands_for = {str(fold.rep(r)): fold.members(r) for r in range(world.Get_size())} \
        if fold else None
    if world.Get_rank() == 0:
        out.mkdir(parents=True, exist_ok=True)
        for stale in list(out.glob("rank-*.h5")) + list(out.glob("trace.h5")):
            stale.unlink()
        write_manifest(out, {"status": "running", "config": w.as_dict(),
                             "config_hash": w.config_hash(), "world_size": world.Get_size(),
                             "grid": {"tp": grid.tp, "dp": grid.dp, "pp": grid.pp}
                             | ({"cp": grid.cp} if grid.cp > 1 else {}),
                             "versions": _versions(), "command": argv, "start": _now(),
                             "end": None, "device": as_table(spec),
                             "processes": processes,     # [host, pid] per rank
                             "placement": list(net.placement) or "block",
                             "emulated_ranks": shape.size,
                             "folded": stands_for})   # file rank -> emulated ranks
        _start_watchman(out, processes)
    arrive(world)
    attrs = {"rank": grid.rank, "world_size": world.Get_size(), "tp_rank": grid.tp_rank,
             "dp_rank": grid.dp_rank, "pp_rank": grid.pp_rank,
             "grid": [grid.tp, grid.dp, grid.pp], "device": as_table(spec),
             "config_hash": w.config_hash(), "mpiemu_version": __version__,
             "workload": w.name,
             "stands_for": fold.members(world.Get_rank()) if fold else [grid.rank]}
    if grid.cp > 1:                 # context parallelism: the rank's chunk pair
        attrs |= {"cp_rank": grid.cp_rank, "grid": [grid.tp, grid.dp, grid.pp, grid.cp]}
    writer = TraceWriter(rank_file(out, grid.rank), attrs)
    tl = Timeline(writer)
    cost = device_cost(spec)
    tp = TimedComm(grid.tp_comm, tl, net, "tp", world_map=grid.world_map,
                   tuning=Tuning(w.collectives.algorithm, w.collectives.protocol))
    dp = tp.sibling(grid.dp_comm, "dp")
    set_aside()                 # what lives for the run, out of every later collection
    return RankContext(w, world, grid, spec, cost, tl, tp, dp, out, writer, processes, log)


def _start_watchman(out: Path, processes: list[list[Any]]) -> None:
    """`runner.watch` beside the job, in its own session (the launcher's kill misses it): it
    marks the manifest `failed` if the ranks on this host die without a word. Its stdio is
    not the rank's (a launcher waits for a rank's pipes to close before it ends the job);
    under MPICH's hydra it also says so on the launcher's own stderr
    (`_proc.launcher_stderr`)."""
    here = socket.gethostname()
    pairs = [f"{r}:{pid}" for r, (host, pid) in enumerate(processes) if host == here]
    env = launcher_free_env(MPI4PY_RC_INITIALIZE="false")   # no MPI process: no MPI_Init
    subprocess.Popen([sys.executable, "-m", "mpiemu.runner.watch", str(out), str(os.getppid()),
                      *pairs], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True,
                     env=env)


def mark_failed(out: Path, rank: int, t_emulated: float, status: str = "failed") -> None:
    """The failing rank's last act: the manifest says `failed` (or `interrupted` on SIGINT /
    SIGTERM), which rank, when, and the emulated time it had reached (rank 0 may be blocked
    in communication; writes are atomic)."""
    path = out / "manifest.json"
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if manifest.get("status") in ("failed", "interrupted"):
        return
    manifest.update({"status": status, "failed_rank": rank, "end": _now(),
                     "failed_at_emulated_s": t_emulated})
    write_manifest(out, manifest)


def close_run(ctx: RankContext, summary: dict[str, Any]) -> None:
    """Collective: mark traces complete, merge them, finish the manifest."""
    ctx.writer.close(complete=True, attrs={"t_end_emulated": ctx.tl.now()})
    counts = ctx.world.gather((ctx.grid.rank, ctx.writer.n_events), root=0)
    if ctx.rank == 0:
        write_merged(ctx.out, dict(counts))  # type: ignore[arg-type]
        manifest = json.loads((ctx.out / "manifest.json").read_text())
        manifest.update({"status": "complete", "end": _now(), "summary": summary})
        write_manifest(ctx.out, manifest)
    ctx.say(f"traces in {ctx.out}/ (mpiemu analyze {ctx.out}; mpiemu export {ctx.out} "
            "--chrome trace.json.gz)")
    arrive(ctx.world)           # MPI_Finalize polls too: rank 0 writes the merged view last
    ctx.grid.free()

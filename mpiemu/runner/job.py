"""Run a workload on every rank: validate collectively, open traces, dispatch by kind, close."""
from __future__ import annotations

import importlib
import socket
from pathlib import Path
from typing import Any, Protocol, Sequence

from mpi4py import MPI

from ..config.workload import Workload, load_workload, resolve_device
from .context import LogOptions, RankContext, close_run, mark_failed, open_run
from ..config.errors import ConfigError
from ..comm.shape import Fold
from .fold_plan import plan_fold
from .mpi import AbortOnError, exit_on_error

# kind -> module with `validate(w, world_size)` and `run(ctx) -> summary`
KIND_MODULES: dict[str, str] = {
    "collectives": "mpiemu.runner.collective_sweep",
    "train": "mpiemu.runner.train",
    "sublayers": "mpiemu.runner.sublayers",
    "layer_sweep": "mpiemu.runner.layer_sweep",
}


class KindModule(Protocol):
    def validate(self, w: Workload, world_size: int) -> None: ...
    def run(self, ctx: RankContext) -> dict[str, Any]: ...


def kind_module(kind: str) -> KindModule:
    return importlib.import_module(KIND_MODULES[kind])  # type: ignore[return-value]


def validate(path: str | None, overrides: Sequence[str], world_size: int) -> Workload:
    """Everything that can be checked before any rank communicates; raises ConfigError."""
    return validate_job(path, overrides, world_size)[0]


def validate_job(path: str | None, overrides: Sequence[str], world_size: int
                 ) -> tuple[Workload, Fold | None]:
    """`validate`, and the job's fold (every rank finds the same)."""
    w = load_workload(path, overrides)
    fold = plan_fold(w, world_size)
    if fold is not None:                # folded: checked on the emulated grid
        world_size = w.parallel.devices
    w.check_world(world_size)
    resolve_device(w)
    kind_module(w.run.kind).validate(w, world_size)
    return w, fold


def holds_run(out: Path) -> bool:
    """The directory holds a run's manifest or rank traces."""
    return (out / "manifest.json").exists() or any(out.glob("rank-*.h5"))


def check_out_dir(out: Path, field: str, force: bool = False) -> None:
    """The run directory exists as a directory we can write into (created if need be) and
    holds no earlier run, unless `force` says to replace it."""
    try:
        if out.exists() and not out.is_dir():
            raise ConfigError(field, str(out), "a directory for the run's traces (this is a "
                              "file)")
        if not force and out.is_dir() and holds_run(out):
            raise ConfigError(field, str(out), "a directory holding no run yet (this one "
                              "holds one: give another --out, or --force to replace it)")
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".mpiemu-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(field, str(out), f"a directory we can create and write into "
                          f"({exc.strerror or exc})") from None


def default_out(w: Workload) -> Path:
    return Path("runs") / w.name


def run_workload(path: str | None, overrides: Sequence[str], out: str | None,
                 argv: list[str], world: MPI.Comm | None = None,
                 log: LogOptions = LogOptions(), force: bool = False) -> dict[str, Any]:
    """Collective over `world`: the whole `mpiemu run` command (`log`: what rank 0
    prints as it goes; `force`: replace a run already in the run directory)."""
    world = MPI.COMM_WORLD if world is None else world
    guard = AbortOnError(world).install()
    err: ConfigError | None = None
    w: Workload | None = None
    fold: Fold | None = None
    out_dir = Path(out) if out else Path("runs")
    try:
        w, fold = validate_job(path, overrides, world.Get_size())
        out_dir = Path(out) if out else default_out(w)
        if world.Get_rank() == 0:
            check_out_dir(out_dir, "--out" if out else "name", force)
    except ConfigError as exc:
        err = exc
    exit_on_error(world, err)
    assert w is not None
    ctx = open_run(w, world, out_dir, argv, fold, log)
    guard.log_dir = out_dir
    guard.on_fail.append(lambda: ctx.writer.close(complete=False))
    here = socket.gethostname()
    guard.peers = {r: pid for r, (host, pid) in enumerate(ctx.processes)
                   if host == here and r != world.Get_rank()}
    guard.on_fail.append(lambda: None if guard.peers_gone else mark_failed(
        out_dir, world.Get_rank(), ctx.tl.now(), "interrupted" if guard.interrupted else "failed"))
    summary = kind_module(w.run.kind).run(ctx)
    close_run(ctx, summary)
    guard.uninstall()
    return summary



"""MPI hygiene: one failing rank ends the job, config errors end it cleanly, rank 0 prints.

An uncaught exception on any rank would otherwise leave the others blocked in communication
and the job hung in MPI_Finalize (mpi4py docs, mpi4py.run); the excepthook here writes one line
naming the rank, lets the caller mark its trace incomplete, and calls MPI_Abort.
"""
from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from pathlib import Path
from types import TracebackType
from typing import Callable

from mpi4py import MPI

from .._proc import alive, launcher_stderr
from ..comm.p2p import wait_all
from ..config.errors import one_line

EXIT_CONFIG = 2
EXIT_CRASH = 1


def say(comm: MPI.Comm, *lines: str) -> None:
    """Print whole lines from rank 0 only (on a terminal, over a progress bar)."""
    if comm.Get_rank() == 0:
        clear = "\r\033[K" if sys.stdout.isatty() else ""
        sys.stdout.write(clear + "".join(f"{line}\n" for line in lines))
        sys.stdout.flush()


def arrive(comm: MPI.Comm) -> None:
    """Collective: return once every rank of `comm` is here, waiting as `p2p.wait_all` does.

    MPI's blocking collectives poll: on a node whose ranks outnumber its cores, the ranks
    that arrive first would take the cores from those still on their way (imports,
    validation, rank 0's report). Called before a blocking collective where ranks arrive
    apart, it leaves that collective only the exchange."""
    wait_all([comm.Ibarrier()])


def agree_on_error(comm: MPI.Comm, err: BaseException | None) -> str | None:
    """Collective: the first rank's error message if any rank failed, else None.

    Lets every rank exit the same way after a validation error instead of one rank raising
    while the others wait for it.
    """
    arrive(comm)                # ranks finish importing and validating far apart
    msgs = comm.allgather(None if err is None else one_line(err))
    return next((m for m in msgs if m), None)


def exit_on_error(comm: MPI.Comm, err: BaseException | None) -> None:
    """If any rank failed validation: rank 0 prints one line, every rank exits non-zero."""
    msg = agree_on_error(comm, err)
    if msg is None:
        return
    if comm.Get_rank() == 0:
        sys.stderr.write(f"mpiemu: error: {msg}\n")
        sys.stderr.flush()
    raise SystemExit(EXIT_CONFIG)


def _raise_interrupt(signum: int, frame: object) -> None:
    """SIGTERM (Slurm's scancel, a time limit) ends the rank as Ctrl-C does."""
    raise KeyboardInterrupt(f"signal {signum}")


def _say_before_abort(text: str) -> None:
    """Write the failing rank's last words where they survive MPI_Abort: MPICH's hydra proxy
    may end the job before forwarding what the rank just wrote to its own stderr, so under
    hydra they go straight to the proxy's stderr (the user's); elsewhere to ours, with a
    moment for the launcher to read it."""
    fd = launcher_stderr(os.getppid())
    if fd is not None:
        try:
            os.write(fd, text.encode())
            return
        except OSError:
            pass
        finally:
            os.close(fd)
    sys.stderr.write(text)
    sys.stderr.flush()
    time.sleep(0.1)


class AbortOnError:
    """Installs an excepthook that records the failure and aborts the whole job."""

    def __init__(self, comm: MPI.Comm) -> None:
        self.comm = comm
        self.on_fail: list[Callable[[], None]] = []
        self.log_dir: Path | None = None
        self.interrupted = False          # SIGINT / SIGTERM rather than a failure
        self.peers: dict[int, int] = {}    # rank -> pid of the other ranks on this host
        self.peers_gone: list[int] = []    # those already dead when we were stopped
        self._prev = sys.excepthook

    def install(self) -> "AbortOnError":
        sys.excepthook = self._hook
        signal.signal(signal.SIGTERM, _raise_interrupt)   # SIGINT already raises
        return self

    def uninstall(self) -> None:
        sys.excepthook = self._prev

    def _gone(self, wait_s: float) -> list[int]:
        """The peers on this host that are dead, looking for up to `wait_s`."""
        deadline = time.monotonic() + wait_s
        while True:
            gone = [r for r, pid in self.peers.items() if not alive(pid)]
            if gone or time.monotonic() >= deadline:
                return gone
            time.sleep(0.01)

    def _hook(self, tp: type[BaseException], val: BaseException,
              tb: TracebackType | None) -> None:
        rank = self.comm.Get_rank()
        self.interrupted = issubclass(tp, KeyboardInterrupt)
        # a peer already dead: we are its consequence (Open MPI's mpirun stops the survivors
        # of a killed rank; a broken connection raises here); the watchman names it. An MPI
        # error may come before the dead peer has finished exiting: look for a second.
        self.peers_gone = self._gone(1.0 if issubclass(tp, MPI.Exception) else 0.0)
        for cb in self.on_fail:
            try:
                cb()
            except Exception:  # noqa: BLE001 - already failing; keep going to Abort
                pass
        text = "".join(traceback.format_exception(tp, val, tb))
        where = ""
        if self.log_dir is not None:
            try:
                path = self.log_dir / f"rank-{rank:05d}.traceback.txt"
                path.write_text(text)
                where = f" (traceback in {path})"
            except OSError:
                pass
        what = "interrupted" if self.interrupted else f"failed: {tp.__name__}: {one_line(val)}"
        if self.peers_gone:        # the watchman names the rank that died first
            what = f"stopped: rank(s) {self.peers_gone} had died ({what})"
        _say_before_abort(f"mpiemu: rank {rank} {what}{where}\n"
                          + (text if os.environ.get("MPIEMU_DEBUG") else ""))
        self.comm.Abort(EXIT_CRASH)

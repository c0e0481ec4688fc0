"""The run's watchman: when the ranks of this host die without a word (SIGKILL, the
out-of-memory killer), it marks the manifest `failed` and names the rank that died first.

A rank that raises, or gets SIGINT / SIGTERM, marks the manifest itself (`context.mark_failed`).
A rank killed outright cannot, and the launcher then kills the others just as hard (MPICH's
hydra with SIGKILL; Open MPI's mpirun sends SIGTERM, and the survivors name the dead rank
themselves, `mpi.AbortOnError`). So rank 0 starts this small process in its own session beside
the job (`python -m mpiemu.runner.watch RUN_DIR LAUNCHER_PID RANK:PID ...`). It listens to the
kernel's process-exit events where it may (root or CAP_NET_ADMIN): they arrive in the order
the processes ended, so the first is the rank that died before the launcher could react.
Elsewhere a pidfd per rank wakes it at the first death (exact when a core is free to run it at
once, as on a cluster node; on an oversubscribed workstation the launcher's kills may land
first and the ranks found dead together are named together). Once every rank is gone while
the manifest still says `running`, it writes `failed` (`failed_rank` the first to die, `cause`
the order) and says so in one line beside the launcher's own messages (MPICH's hydra:
`_proc.launcher_stderr`). It exits once the ranks are gone. Readers also recognise a
`running` manifest with no live process (`analysis.load`), for when the watchman itself was
killed.
"""
from __future__ import annotations

import json
import os
import select
import socket
import struct
import sys
import time
from pathlib import Path

from .._proc import alive, launcher_stderr

POLL_S = 0.05          # only where neither exit events nor pidfds are available
# linux/connector.h, linux/cn_proc.h, linux/netlink.h: the process-event connector
_NETLINK_CONNECTOR, _CN_IDX_PROC, _CN_VAL_PROC, _PROC_CN_MCAST_LISTEN = 11, 1, 1, 1
_NLMSG_DONE, _PROC_EVENT_EXIT = 3, 0x80000000
DYING_NS = 1_000_000_000     # a process's threads end within this of its main thread


def _status(out: Path) -> str | None:
    try:
        return json.loads((out / "manifest.json").read_text()).get("status")
    except (OSError, ValueError):
        return None


def _exit_events() -> socket.socket | None:
    """A netlink socket on the kernel's process-event connector (exits arrive in the order
    they happened, each stamped by the kernel), or None without CAP_NET_ADMIN."""
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_CONNECTOR)
        sock.bind((0, _CN_IDX_PROC))
        op = struct.pack("=I", _PROC_CN_MCAST_LISTEN)
        cn = struct.pack("=IIIIHH", _CN_IDX_PROC, _CN_VAL_PROC, 0, 0, len(op), 0) + op
        sock.send(struct.pack("=IHHII", 16 + len(cn), _NLMSG_DONE, 0, 0, 0) + cn)
        return sock
    except (AttributeError, OSError):
        return None


def exact() -> bool:
    """Whether this host gives the watchman the kernel's exit events (exact naming)."""
    sock = _exit_events()
    if sock is None:
        return False
    sock.close()
    return True


def _exited(data: bytes) -> tuple[int, int, int] | None:
    """(thread id, process id, kernel time in ns) of the exit a connector message reports."""
    if len(data) < 60 or struct.unpack_from("=I", data, 36)[0] != _PROC_EVENT_EXIT:
        return None
    t_ns = struct.unpack_from("=Q", data, 44)[0]
    pid, tgid = struct.unpack_from("=II", data, 52)
    return pid, tgid, t_ns


def _in_order(exits: dict[int, list[int]], ended: dict[int, int],
              rank_of: dict[int, int]) -> list[list[int]]:
    """Ranks by when they began to die: the first exit among a process's threads within
    DYING_NS of its main thread's (`ended`), which tends to go last and slowly, tearing down
    the address space, so that the launcher's kills of the others can land before it."""
    when = {rank_of[p]: min([t_end] + [t for t in exits.get(p, []) if t >= t_end - DYING_NS])
            for p, t_end in ended.items()}
    return [[r] for r in sorted(when, key=lambda r: (when[r], r))]


def _pidfds(ranks: dict[int, int]) -> dict[int, int] | None:
    """rank -> pidfd, or None where the platform has none (the caller polls instead)."""
    fds: dict[int, int] = {}
    for r, pid in ranks.items():
        try:
            fds[r] = os.pidfd_open(pid)
        except ProcessLookupError:
            continue                               # gone already: seen dead at once
        except (AttributeError, OSError):
            for fd in fds.values():
                os.close(fd)
            return None
    return fds


def deaths(ranks: dict[int, int]) -> list[list[int]]:
    """Block until every pid of `ranks` (rank -> pid) has ended; the ranks in the order they
    ended, in groups that could not be told apart. Exact with the process-event connector
    (the first exit is the rank that died first, before the launcher could react); otherwise
    a pidfd per rank wakes us at the first death (exact when a core is free to run us, as on
    a cluster node), else a poll every POLL_S."""
    order: list[list[int]] = []
    seen: set[int] = set()
    rank_of = {pid: r for r, pid in ranks.items()}
    exits: dict[int, list[int]] = {}       # pid -> kernel times of its threads' exits
    ended: dict[int, int] = {}             # pid -> kernel time of its main thread's exit

    def note(pids: list[int] | None = None) -> None:
        dead = [rank_of[p] for p in pids] if pids is not None else \
            [r for r, pid in ranks.items() if not alive(pid)]
        dead = [r for r in dead if r not in seen]
        if dead:
            order.append(dead)
            seen.update(dead)

    events = _exit_events()
    fds = None if events is not None else _pidfds(ranks)
    note()                                         # died before we listened
    poller = select.poll()
    for fd in ([events.fileno()] if events is not None else list((fds or {}).values())):
        poller.register(fd, select.POLLIN)
    while len(seen) < len(ranks):
        if events is not None or fds is not None:
            ready = poller.poll(1000)
        else:
            time.sleep(POLL_S)
            ready = []
        if events is not None and ready:
            try:
                ev = _exited(events.recv(65536))
            except OSError:          # the socket overflowed: fall back on liveness
                ev = None
            if ev is not None and ev[1] in rank_of:
                if ev[0] != ev[1]:
                    exits.setdefault(ev[1], []).append(ev[2])
                else:                # the main thread: the process has ended
                    ended[ev[0]] = ev[2]
                    note([ev[0]])
                continue
        note()                       # a pidfd turned readable, a poll, or a quiet second
    for fd in (fds or {}).values():
        os.close(fd)
    if events is not None:
        events.close()
        if len(ended) == len(ranks):       # every end seen as it happened
            return _in_order(exits, ended, rank_of)
    return order


def watch(out: Path, ranks: dict[int, int]) -> None:
    """Wait for the ranks to end; mark a silent death and say it in one line."""
    order = deaths(ranks)
    if _status(out) != "running" or not order:
        return                   # complete, failed or interrupted: said by the ranks
    from .context import mark_failed, write_manifest  # noqa: PLC0415 (only on a death)
    first = order[0]
    mark_failed(out, min(first), float("nan"), "failed")
    manifest = json.loads((out / "manifest.json").read_text())
    then = [r for group in order[1:] for r in group]
    manifest["cause"] = (f"rank{'s' if len(first) > 1 else ''} {', '.join(map(str, first))} "
                         f"killed without a word (SIGKILL, out of memory)"
                         + (f"; then ranks {then}" if then else ""))
    write_manifest(out, manifest)
    try:                         # the job's stderr may be gone (Open MPI forwards it)
        sys.stderr.write(f"mpiemu: {manifest['cause']} (watchman; manifest in {out})\n")
        sys.stderr.flush()
    except OSError:
        pass


def main(argv: list[str]) -> int:
    out, launcher, pairs = Path(argv[0]), int(argv[1]), argv[2:]
    fd = launcher_stderr(launcher)
    if fd is not None:
        os.dup2(fd, 2)
        os.close(fd)
    watch(out, {int(r): int(p) for r, p in (x.split(":") for x in pairs)})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

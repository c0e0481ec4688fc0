"""Folding's communicators: one MPI rank plays a class of exact images (docs/folding.md).

In a timing-only run on identical devices, the ranks a TP / DP shift connects (`comm.shape.
Fold`, checked by `runner.fold_plan`) have the same emulated times with their devices renamed.
One MPI rank plays each class's representative. A group of the representative then has
members of three kinds, each found by the class it belongs to:

* the representative itself;
* images of it (same class): what such a member at offset -k sends here is the image of
  what this rank sent to its member at offset +k, with the same header: kept in a queue per
  (tag, offset) and taken back on the receive (MPI's non-overtaking order); nothing travels;
* members of another class: played by that class's process, whose own group is the image of
  this one shifted (offsets within a group are kept by every shift), so a message to the
  member at offset +k is a real message to that process, on a tag that carries the offset;
  it receives it as the message from its own member at offset -k.

`FoldedComm` is such a group. Mirroring is exact only while every member would really send
what its class's representative sends: a receive whose sender never sent its image, or whose
bytes differ (a ring over a length the group does not divide), raises `FoldError` instead
of guessing; an algorithm whose members play different roles (NCCL's trees) runs only on a
group of representatives, which `group_comm` builds as a plain MPI communicator. A group
that mixes stages with their images (the gradient norm's model-parallel group, the world)
cannot mirror messages; it only takes scalar maxima, over the processes of its classes.
"""
from __future__ import annotations

from collections import deque
from typing import Any, Callable, Sequence

import numpy as np
from mpi4py import MPI


class FoldError(RuntimeError):
    """Folding met something that would make it inexact (says what and how to run instead)."""


# the collectives exact on a group with images: rings (also inside `hierarchical`) and NVLS
MIRRORED_ALGORITHMS = ("ring", "nvls", "hierarchical")


class FoldedComm:
    """An MPI.Comm stand-in for a group whose member i is played by rank `procs[i]` of
    `real` (this rank: `procs[rank]`; the same rank again: an image of this rank)."""

    algorithms = MIRRORED_ALGORITHMS

    def __init__(self, name: str, rank: int, devices: Sequence[int], procs: Sequence[int],
                 real: Any = None, mixed: bool = False) -> None:
        self.name, self.rank = name, rank
        self.devices, self.procs = list(devices), list(procs)
        self.size = len(self.devices)
        self.real, self.mixed = real, mixed
        self.me = self.procs[rank]
        self._sent: dict[tuple[int, int], deque[np.ndarray]] = {}

    @classmethod
    def images(cls, name: str, rank: int, devices: Sequence[int]) -> "FoldedComm":
        """A group whose other members are all images of this rank (no MPI)."""
        return cls(name, rank, devices, [0] * len(devices))

    def Get_size(self) -> int:
        return self.size

    def Get_rank(self) -> int:
        return self.rank

    def Dup(self) -> "FoldedComm":
        real = None if self.real is None else self.real.Dup()
        return FoldedComm(self.name, self.rank, self.devices, self.procs, real, self.mixed)

    def Free(self) -> None:
        self._sent.clear()
        if self.real is not None:
            self.real.Free()

    def __eq__(self, other: object) -> bool:      # `c == MPI.COMM_NULL` checks
        return other is self

    __hash__ = object.__hash__

    def unfoldable(self, what: str) -> FoldError:
        return FoldError(f"run.fold: the {self.name} group {what}, so folding would not be "
                         "exact; run with run.fold = \"off\" on every emulated rank")

    def _tag(self, tag: int, offset: int) -> int:
        """The real tag of a message to the member `offset` ahead."""
        return tag * self.size + offset

    def Isend(self, buf: np.ndarray, dest: int, tag: int) -> MPI.Request:
        """An image: keep the header for the image of this send that arrives here; another
        class: a real message to its process."""
        if self.mixed:
            raise self.unfoldable("spans pipeline stages and their images (it can only "
                                  "reduce scalars)")
        offset = (dest - self.rank) % self.size
        if self.procs[dest] != self.me:
            return self.real.Isend(buf, self.procs[dest], self._tag(tag, offset))
        self._sent.setdefault((tag, offset), deque()).append(np.array(buf, copy=True))
        return MPI.REQUEST_NULL

    def take(self, source: int, tag: int, header: np.ndarray, nbytes: float | None) -> None:
        """Fill `header` with what the image `source` sent here: the image of this rank's
        send to the member at the same offset the other way."""
        q = self._sent.get((tag, (self.rank - source) % self.size))
        if not q:
            raise self.unfoldable(f"receives from rank {source} a message this rank never "
                                  "sent the other way (an algorithm whose ranks differ: a "
                                  "tree)")
        header[:] = q.popleft()
        self.check_bytes(header, nbytes)

    def check_bytes(self, header: np.ndarray, nbytes: float | None) -> None:
        """The sender's image moved what the receiver expects (else the group's members
        differ: a length the group does not divide)."""
        if nbytes is not None and float(header[4]) != nbytes:
            raise self.unfoldable(f"moves {int(header[4])} bytes where its peer expects "
                                  f"{int(nbytes)} (a length the group does not divide "
                                  "evenly)")

    def receive(self, header: np.ndarray, source: int, tag: int, nbytes: float | None
                ) -> tuple[list[MPI.Request], Callable[[], None]]:
        """Post the receive of a message header from `source`: the requests to wait for,
        and what fills (and checks) `header` once they completed."""
        if self.procs[source] == self.me:
            return [], lambda: self.take(source, tag, header, nbytes)
        offset = (self.rank - source) % self.size
        req = self.real.Irecv(header, self.procs[source], self._tag(tag, offset))
        return [req], lambda: self.check_bytes(header, nbytes)

    def allreduce(self, value: Any, op: MPI.Op = MPI.MAX) -> Any:
        """The max over the group: images hold this rank's value, other classes theirs."""
        if op != MPI.MAX:
            raise self.unfoldable("reduces values other than a maximum")
        return self.real.allreduce(value, op=op) if self.real is not None else value

    def sub(self, positions: Sequence[int]) -> "FoldedComm":
        """Collective over `real`: the sub-group of these members (this rank among them),
        e.g. a node's members, as every image splits its own group the same way."""
        procs = [self.procs[i] for i in positions]
        real = None if self.real is None else self.real.Split(color=min(procs), key=self.me)
        order = sorted(set(procs))
        return FoldedComm(f"{self.name}.sub", positions.index(self.rank),
                          [self.devices[i] for i in positions],
                          [order.index(q) for q in procs], real, self.mixed)

    def Split(self, color: int, key: int) -> Any:
        raise self.unfoldable("splits by values only this rank knows (use `sub`)")

    def Allreduce(self, *args: Any) -> None:
        raise self.unfoldable("moves payload (numerics on)")


def group_comm(world: MPI.Comm, name: str, members: Sequence[int], me: int,
               proc: Callable[[int], int], rep: Callable[[int], int],
               mixed: bool = False) -> Any:
    """Collective over `world` (every process calls it for the same kind of group): the
    group of emulated ranks `members` (this process playing `me`), each played by process
    `proc(member)`. Members that are all representatives (`rep(proc(m)) == m`) make a plain
    MPI communicator, in member order; otherwise a `FoldedComm` over the processes of its
    classes (whose images of this group cover the same classes)."""
    procs = [proc(m) for m in members]
    plain = not mixed and all(rep(q) == m for q, m in zip(procs, members))
    # the processes of one class set agree on `plain`: each plays a member of this group
    real = world.Split(color=min(procs), key=members.index(me) if plain else world.Get_rank())
    if plain:
        return real
    order = sorted(set(procs))
    return FoldedComm(name, members.index(me), members, [order.index(q) for q in procs],
                      real, mixed)

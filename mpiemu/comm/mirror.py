"""Symmetric folding: one MPI rank stands for every emulated GPU of its pipeline stage.

In a timing-only run on identical devices, the TP x DP ranks of one pipeline stage are
images of each other: shifting every device's (tp, dp) coordinates by (a, b)
(`comm.shape.Fold.image`)
maps the grid and, when the network looks the same from every member (checked by
`runner.fold_plan`), its routes onto themselves. So the emulated times of rank (a, b, p) equal those
of rank (0, 0, p), and a message rank (0, 0, p) receives from its group peer at offset -k
left that peer when its own matching send to offset +k left it, with the same header.

`Mirror` stands in for the MPI communicator of a TP or DP group whose other members are
such images: a send stores its header in a queue per (tag, offset); a receive from offset
-k takes the next header of queue (tag, +k) (MPI's non-overtaking order). Nothing travels.
Mirroring is exact only while every member would really send what this rank sends: a
receive whose sender never sent its image, or whose bytes differ (a ring over a length the
group does not divide), raises `FoldError` instead of guessing. Stages stay real MPI ranks:
pipeline sends and the tied-embedding all-reduce run as before between representatives.
A group that mixes stages with their images (the gradient norm's model-parallel group)
cannot mirror messages; it only takes scalar reductions (`Mirror.allreduce`, over the
representatives).

`RingMirror` stands in for the DP x CP group (context parallelism): its members j = c + cp d
are played by the stage's cp real ranks, member j by real rank j mod cp, the others being
images shifted by whole DP replicas. A send to member `dest` is a real message to real rank
dest mod cp; a receive from `source` a real receive from source mod cp. Two ring directions
may land on the same real peer, so the direction is folded into the real tag; only rings
(offsets +1 and -1) are exact, anything else raises `FoldError`.
"""
from __future__ import annotations

from collections import deque
from typing import Any, Callable, Sequence

import numpy as np
from mpi4py import MPI


class FoldError(RuntimeError):
    """Folding met something that would make it inexact (says what and how to run instead)."""


class Mirror:
    """An MPI.Comm stand-in for a group of `size` whose members other than `rank` are images
    of it (`mixed`: it also holds real ranks of other stages, reached through `real`)."""

    # collectives exact here: a ring, or NVLS (only a maximum over the members crosses)
    algorithms = ("ring", "nvls")

    def __init__(self, name: str, size: int, rank: int, devices: Sequence[int],
                 real: MPI.Comm | None = None, mixed: bool = False) -> None:
        self.name, self.size, self.rank = name, size, rank
        self.devices = list(devices)
        self.real, self.mixed = real, mixed
        self._sent: dict[tuple[int, int], deque[np.ndarray]] = {}

    def Get_size(self) -> int:
        return self.size

    def Get_rank(self) -> int:
        return self.rank

    def Dup(self) -> "Mirror":
        return Mirror(self.name, self.size, self.rank, self.devices, self.real, self.mixed)

    def Free(self) -> None:
        self._sent.clear()

    def __eq__(self, other: object) -> bool:      # `c == MPI.COMM_NULL` checks
        return other is self

    __hash__ = object.__hash__

    def _unfoldable(self, what: str) -> FoldError:
        return FoldError(f"run.fold: the {self.name} group {what}, so folding would not be "
                         "exact; run with run.fold = \"off\" on every emulated rank")

    def Isend(self, buf: np.ndarray, dest: int, tag: int) -> MPI.Request:
        """Keep the header for the image of this send that arrives here."""
        if self.mixed:
            raise self._unfoldable("spans pipeline stages and their images (it can only "
                                   "reduce scalars)")
        self._sent.setdefault((tag, (dest - self.rank) % self.size), deque()).append(
            np.array(buf, copy=True))
        return MPI.REQUEST_NULL

    def take(self, source: int, tag: int, header: np.ndarray, nbytes: float | None) -> None:
        """Fill `header` with what `source` sent here: the image of this rank's send to the
        peer at the same offset the other way."""
        q = self._sent.get((tag, (self.rank - source) % self.size))
        if not q:
            raise self._unfoldable(f"receives from rank {source} a message this rank never "
                                   "sent the other way (an algorithm whose ranks differ: a "
                                   "tree, a hierarchical all-reduce)")
        header[:] = q.popleft()
        self.check_bytes(header, nbytes)

    def check_bytes(self, header: np.ndarray, nbytes: float | None) -> None:
        """The sender's image moved what the receiver expects (else the group's members
        differ: a length the group does not divide)."""
        if nbytes is not None and float(header[4]) != nbytes:
            raise self._unfoldable(f"moves {int(header[4])} bytes where its peer expects "
                                   f"{int(nbytes)} (a length the group does not divide "
                                   "evenly)")

    def receive(self, header: np.ndarray, source: int, tag: int, nbytes: float | None
                ) -> tuple[list[MPI.Request], Callable[[], None]]:
        """Post the receive of a message header from `source`: the requests to wait for,
        and what fills (and checks) `header` once they completed."""
        return [], lambda: self.take(source, tag, header, nbytes)

    def allreduce(self, value: Any, op: MPI.Op = MPI.MAX) -> Any:
        """The max over the group: images hold this rank's value, representatives theirs."""
        if op != MPI.MAX:
            raise self._unfoldable("reduces values other than a maximum")
        return self.real.allreduce(value, op=op) if self.real is not None else value

    def Split(self, color: int, key: int) -> Any:
        raise self._unfoldable("splits into sub-groups (a hierarchical algorithm)")

    def Allreduce(self, *args: Any) -> None:
        raise self._unfoldable("moves payload (numerics on)")


# the real tag of a RingMirror message: the group's tag and the ring direction
RING_TAGS = {+1: 0, -1: 1}


class RingMirror(Mirror):
    """A group of `size` whose member j is played by real rank j mod q of `peers` (q real
    members) and stands for the members j + q k, images of it (the DP x CP group: q = cp).
    Messages go between the real members, one per ring direction on its own real tag;
    with q = 1 it is the plain `Mirror`."""

    def __init__(self, name: str, size: int, rank: int, devices: Sequence[int],
                 peers: MPI.Comm) -> None:
        super().__init__(name, size, rank, devices, real=peers)
        self.peers = peers
        self.q = peers.Get_size()
        if size % self.q or rank % self.q != peers.Get_rank():
            raise ValueError(f"{name}: member {rank} of {size} is not played by real rank "
                             f"{peers.Get_rank()} of {self.q}")

    def Dup(self) -> "RingMirror":
        return RingMirror(self.name, self.size, self.rank, self.devices, self.peers.Dup())

    def Free(self) -> None:
        super().Free()
        self.peers.Free()

    def ring_tag(self, tag: int, offset: int) -> int:
        """The real tag of a message to the member `offset` ahead (+1 or -1 around the
        ring; a group of two has one direction)."""
        offset %= self.size
        if offset == 1:
            return 2 * tag + RING_TAGS[+1]
        if offset == self.size - 1:
            return 2 * tag + RING_TAGS[-1]
        raise self._unfoldable(f"sends to the member {offset} ahead, where only rings are "
                               "exact (its members are played by the context-parallel "
                               "ranks of the stage)")

    def Isend(self, buf: np.ndarray, dest: int, tag: int) -> MPI.Request:
        """A real message to the real rank that plays `dest`."""
        if self.q == 1:
            return super().Isend(buf, dest, tag)
        return self.peers.Isend(buf, dest % self.q, self.ring_tag(tag, dest - self.rank))

    def receive(self, header: np.ndarray, source: int, tag: int, nbytes: float | None
                ) -> tuple[list[MPI.Request], Callable[[], None]]:
        """A real receive from the real rank that plays `source` (what it sent to the
        member at the same offset, of which `source`'s send here is an image)."""
        if self.q == 1:
            return super().receive(header, source, tag, nbytes)
        req = self.peers.Irecv(header, source % self.q, self.ring_tag(tag, self.rank - source))
        return [req], lambda: self.check_bytes(header, nbytes)

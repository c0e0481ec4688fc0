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
"""
from __future__ import annotations

from collections import deque
from typing import Any, Sequence

import numpy as np
from mpi4py import MPI


class FoldError(RuntimeError):
    """Folding met something that would make it inexact (says what and how to run instead)."""


class Mirror:
    """An MPI.Comm stand-in for a group of `size` whose members other than `rank` are images
    of it (`mixed`: it also holds real ranks of other stages, reached through `real`)."""

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
        h = q.popleft()
        if nbytes is not None and float(h[4]) != nbytes:
            raise self._unfoldable(f"moves {int(h[4])} bytes where its peer expects "
                                   f"{int(nbytes)} (a length the group does not divide "
                                   "evenly)")
        header[:] = h

    def allreduce(self, value: Any, op: MPI.Op = MPI.MAX) -> Any:
        """The max over the group: images hold this rank's value, representatives theirs."""
        if op != MPI.MAX:
            raise self._unfoldable("reduces values other than a maximum")
        return self.real.allreduce(value, op=op) if self.real is not None else value

    def Split(self, color: int, key: int) -> Any:
        raise self._unfoldable("splits into sub-groups (a hierarchical algorithm)")

    def Allreduce(self, *args: Any) -> None:
        raise self._unfoldable("moves payload (numerics on)")

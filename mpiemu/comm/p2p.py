"""Timestamped point-to-point messages: the payload moves for real, its time is modelled.

Every message is a small header (send start, arrival time, modelled bytes) followed, when
numerics are on, by the payload with buffer-based Isend/Irecv (no pickling). The header and
payload share (source, tag, communicator), so MPI's non-overtaking rule pairs them.
Causality (DESIGN.md): a send occupies the sender's link for alpha + bytes/beta from
max(data ready, link free); a receive completes at max(time posted, that arrival).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from ..hw.cost import ComputeModel
from ..hw.specs import LinkSpec
from ..sim.timeline import SimTime, Span, Timeline

HEADER_LEN = 3   # t_send_start, t_arrive, modelled bytes


@dataclass
class RecvHandle:
    """A posted receive; `wait` returns its emulated completion time."""

    reqs: list[MPI.Request]
    header: np.ndarray
    t_posted: SimTime
    source: int

    def wait(self) -> SimTime:
        MPI.Request.Waitall(self.reqs)
        return max(self.t_posted, float(self.header[1]))

    @property
    def t_arrive(self) -> SimTime:
        return float(self.header[1])


@dataclass
class SendHandle:
    """A posted send; its link occupancy is already placed in emulated time."""

    reqs: list[MPI.Request]
    span: Span
    header: np.ndarray = field(repr=False)

    def wait(self) -> SimTime:
        MPI.Request.Waitall(self.reqs)
        return self.span.t_end


class TimedComm:
    """An MPI communicator bound to a rank's timeline, link model and device model.

    Resources it uses on the timeline: `link.<name>.next`, `link.<name>.prev` (one per link
    direction; on a fully connected topology one per peer) and `comm.<name>`, the stream that
    runs the collective's reductions.
    """

    def __init__(self, comm: MPI.Comm, timeline: Timeline, link: LinkSpec,
                 model: ComputeModel, name: str = "world") -> None:
        self.comm = comm
        self.tl = timeline
        self.link = link
        self.model = model
        self.name = name
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.next = (self.rank + 1) % self.size
        self.prev = (self.rank - 1) % self.size
        self.stream = f"comm.{name}"
        self._pool: dict[tuple[str, str], np.ndarray] = {}

    def scratch(self, key: str, n: int, dtype: np.dtype) -> np.ndarray:
        """A reusable work buffer of n elements (kept between calls: no page faults)."""
        dt = np.dtype(dtype)
        buf = self._pool.get((key, dt.str))
        if buf is None or buf.size < n:
            buf = self._pool[(key, dt.str)] = np.empty(max(n, 1), dt)
        return buf[:n]

    def link_resource(self, dest: int, direction: str | None = None) -> str:
        """The link a message to `dest` leaves on ('next'/'prev' pick a ring direction)."""
        if direction is None:
            if dest == self.next:
                direction = "next"
            elif dest == self.prev:
                direction = "prev"
            elif self.link.topology == "fully-connected":
                direction = f"to{dest}"
            else:
                raise ValueError(f"rank {self.rank} has no ring link to {dest} on {self.name}")
        return f"link.{self.name}.{direction}"

    def isend(self, buf: np.ndarray | None, dest: int, tag: int, nbytes: int,
              after: SimTime, *, direction: str | None = None, label: str = "send",
              stage: int = -1, duration: SimTime | None = None, dram_bytes: float = 0.0
              ) -> SendHandle:
        """Send `buf` (None: header only) that is ready at `after`; charge the link.

        The link is busy for alpha + bytes/beta, or for `duration` when something slower
        than the link feeds it (a reduction streamed into the send).
        """
        res = self.link_resource(dest, direction)
        busy = self.link.transfer_s(nbytes) if duration is None else duration
        span = self.tl.reserve(label, [res], busy, after, cat="comm", nbytes=nbytes,
                               peer=dest, stage=stage, dram_bytes=dram_bytes)
        header = np.array([span.t_start, span.t_end, float(nbytes)])
        reqs = [self.comm.Isend(header, dest, tag)]
        if buf is not None:
            reqs.append(self.comm.Isend(buf, dest, tag))
        return SendHandle(reqs, span, header)

    def irecv(self, buf: np.ndarray | None, source: int, tag: int, posted: SimTime
              ) -> RecvHandle:
        """Post a receive into `buf` (None: header only), posted at emulated time `posted`."""
        header = np.empty(HEADER_LEN)
        reqs = [self.comm.Irecv(header, source, tag)]
        if buf is not None:
            reqs.append(self.comm.Irecv(buf, source, tag))
        return RecvHandle(reqs, header, posted, source)

    def reduce_s(self, n_elems: int, elem_bytes: int) -> SimTime:
        """Modelled time of one ring step's reduction of n elements."""
        return self.model.reduction_s(n_elems, elem_bytes)

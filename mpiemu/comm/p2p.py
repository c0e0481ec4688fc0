"""Timestamped point-to-point messages: the payload moves for real, its time is modelled.

Every message is a small header (`net.message`: send start, egress end, wire time, hop
latency, bytes) followed, when numerics are on, by the payload with buffer-based
Isend/Irecv (no pickling). The header and payload share (source, tag, communicator), so
MPI's non-overtaking rule pairs them. Timing is the network layer's (`net.message`): the
sender reserves its egress port, the receiver its ingress port, the message arrives one hop
latency after both; a receive completes at max(time posted, arrival) (DESIGN.md causality).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np
from mpi4py import MPI

from .._threads import oversubscribed
from ..net import HEADER_LEN, Network, arrival, send
from ..net.message import Feed
from ..sim.timeline import SimTime, Timeline
from .folded import FoldedComm


def _oversubscribed() -> bool:
    """More ranks on this node than cores it lets us use: waiting ranks must yield. The
    launcher says how many ranks it put here (asking MPI would be a collective, and the
    first wait of each rank comes at a different moment)."""
    env = os.environ.get("MPIEMU_YIELD", "")
    if env in ("0", "1"):
        return env == "1"
    return oversubscribed()


_YIELD: bool | None = None
YIELD_SPINS = 32        # emulator detail: test-and-yield rounds before a waiting rank sleeps
MAX_SLEEP_S = 2e-4      # emulator detail: the longest sleep between two tests (see wait_all)


def wait_all(reqs: Sequence[MPI.Request], max_sleep_s: float = MAX_SLEEP_S) -> None:
    """MPI_Waitall, or, when ranks outnumber cores, test-and-yield so that a waiting rank
    gives its core to the rank it waits for instead of spinning in the MPI progress loop
    (`MPIEMU_YIELD=0/1` forces it off / on). `max_sleep_s`: the longest sleep between two
    tests; a wait that is often long (a pipeline stage waiting for its neighbour) asks more."""
    global _YIELD
    if _YIELD is None:
        _YIELD = _oversubscribed()
    if not _YIELD:
        MPI.Request.Waitall(reqs)
        return
    spins = 0
    while not MPI.Request.Testall(reqs):
        # yield first (the peer may be about to answer), then sleep, longer and longer up to
        # max_sleep_s: a rank that waits long (a far pipeline stage) leaves the cores to the
        # ranks with work instead of taking its turn in every round of the scheduler. Each
        # test costs a wake-up and an MPI progress pass; a cap too long oversleeps short waits
        # (a TP ring's: 1 ms), one too short makes idle ranks poll (a 64-stage pipeline's)
        if spins < YIELD_SPINS:
            os.sched_yield()
        else:
            time.sleep(min(max_sleep_s, 1e-5 * 2 ** min(spins - YIELD_SPINS, 14)))
        spins += 1


def world_devices(comm: Any, world_map: Sequence[int] | None = None) -> list[int]:
    """The device each rank of `comm` plays: its world rank, or `world_map[world rank]` (a
    folded job's MPI ranks play the stages' representatives); a `FoldedComm` knows its own."""
    if isinstance(comm, FoldedComm):
        return comm.devices
    if comm == MPI.COMM_WORLD:
        ranks = list(range(comm.Get_size()))
    else:
        grp, world = comm.Get_group(), MPI.COMM_WORLD.Get_group()
        try:
            ranks = [int(d) for d in MPI.Group.Translate_ranks(
                grp, list(range(comm.Get_size())), world)]
        finally:
            grp.Free()
            world.Free()
    return ranks if world_map is None else [world_map[r] for r in ranks]


@dataclass
class RecvHandle:
    """A posted receive; `wait` returns its emulated completion time (ingress reserved once)."""

    tc: "TimedComm"
    reqs: list[MPI.Request]
    header: np.ndarray
    t_posted: SimTime
    source: int
    # a folded group's header: filled from this rank's own sends, or checked once the real
    # receive completed (`FoldedComm.receive`)
    fill: Callable[[], None] | None = field(default=None, repr=False)
    _arrive: SimTime | None = field(default=None, repr=False)

    def wait(self, max_sleep_s: float = MAX_SLEEP_S) -> SimTime:
        wait_all(self.reqs, max_sleep_s)
        return max(self.t_posted, self.t_arrive)

    @property
    def t_arrive(self) -> SimTime:
        """When the message is in this rank's memory (call after the requests completed)."""
        if self._arrive is None:
            if self.fill is not None:
                self.fill()
            self._arrive = self.tc.arrival(self.source, self.header)
        return self._arrive


@dataclass
class SendHandle:
    """A posted send; its egress occupancy is already placed in emulated time."""

    reqs: list[MPI.Request]
    header: np.ndarray = field(repr=False)

    @property
    def t_start(self) -> SimTime:
        return float(self.header[0])

    @property
    def t_sent(self) -> SimTime:
        """When the sender's port is free again (the buffer may be reused)."""
        return float(self.header[1])

    def wait(self) -> SimTime:
        wait_all(self.reqs)
        return self.t_sent


class Call(NamedTuple):
    """How one call's messages are timed besides their route: the protocol NCCL runs the call
    with, the share of a port's channels it drives and its algorithm (whose hop latencies it
    pays). A value that travels with the call (`comm.collectives` makes one per call); a
    point-to-point message is `P2P`."""

    protocol: str = "simple"
    share: float = 1.0
    algorithm: str = "ring"


P2P = Call()


class Tuning(NamedTuple):
    """A communicator's fixed choice of algorithm and protocol for its collectives
    (`[collectives]`, as NCCL_ALGO / NCCL_PROTO are read when a communicator is made);
    "" lets NCCL's tuner pick (`comm.cost.choose`)."""

    algorithm: str = ""
    protocol: str = ""


class TimedComm:
    """An MPI communicator bound to a rank's timeline and the job's network.

    `devices[i]` is the emulated device rank i of `comm` plays (its world rank unless
    given); every message asks the network for its route between devices (`net.message`),
    timed by the `Call` it belongs to. `stream` (`comm.<name>`) runs the collective's
    reductions. What a reduction costs is the device's (`devices.cost`), passed to each
    collective call; nothing here belongs to one call.
    """

    def __init__(self, comm: Any, timeline: Timeline, net: Network, name: str = "world",
                 devices: Sequence[int] | None = None,
                 world_map: Sequence[int] | None = None, tuning: Tuning = Tuning()) -> None:
        self.comm = comm
        self.tl = timeline
        self.net = net
        self.name = name
        self.tuning = tuning
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.world_map = world_map
        self.devices = list(devices) if devices is not None else world_devices(comm, world_map)
        self.device = self.devices[self.rank]
        self.next = (self.rank + 1) % self.size
        self.prev = (self.rank - 1) % self.size
        self.stream = f"comm.{name}"
        self._pool: dict[tuple[str, str], np.ndarray] = {}
        self._subs: dict[str, TimedComm] = {}
        # what depends only on the group, the network and the call's shape, kept per group
        # (the emulator's own cost per op, not modelled): NCCL choices, ring orders, plans
        self.memo: dict[tuple[object, ...], Any] = {}

    def sibling(self, comm: Any, name: str, timeline: Timeline | None = None
                ) -> "TimedComm":
        """Another communicator on the same network, with the same tuning."""
        return TimedComm(comm, timeline or self.tl, self.net, name, world_map=self.world_map,
                         tuning=self.tuning)

    def split(self, key: str, color_of: Callable[[int], int]) -> "TimedComm":
        """A sub-communicator (cached): the ranks r whose `color_of(r)` is this rank's, in
        rank order (a folded group knows every member's color, not only its own)."""
        sub = self._subs.get(key)
        if sub is None:
            mine = color_of(self.rank)
            comm = self.comm.sub([r for r in range(self.size) if color_of(r) == mine]) \
                if isinstance(self.comm, FoldedComm) else self.comm.Split(mine, self.rank)
            sub = self._subs[key] = self.sibling(comm, f"{self.name}.{key}")
        return sub

    def hierarchy(self) -> tuple["TimedComm", "TimedComm"]:
        """This rank's node group and its rail across nodes (the members at its place in
        every node): the two levels of the hierarchical all-reduce and NVLS Tree."""
        node = [self.net.node_of(d) for d in self.devices]
        return (self.split("node", node.__getitem__),
                self.split("rail", lambda r: node[:r].count(node[r])))

    def scratch(self, key: str, n: int, dtype: np.dtype) -> np.ndarray:
        """A reusable work buffer of n elements (kept between calls: no page faults)."""
        dt = np.dtype(dtype)
        buf = self._pool.get((key, dt.str))
        if buf is None or buf.size < n:
            buf = self._pool[(key, dt.str)] = np.empty(max(n, 1), dt)
        return buf[:n]

    # ---- time ----------------------------------------------------------------------------
    def rate(self, dest: int, call: Call = P2P) -> float:
        """Bytes/s a message of `call` to rank `dest` moves (the hop's rate)."""
        return self.net.rate(self.net.hop(self.device, self.devices[dest]), call.protocol,
                             call.share)

    def latency(self, dest: int, call: Call = P2P) -> float:
        """The hop latency a message of `call` to rank `dest` pays."""
        return self.net.latency(self.net.hop(self.device, self.devices[dest]), call.protocol,
                                call.algorithm)

    def place(self, dest: int, nbytes: float, after: SimTime, call: Call = P2P, *,
              label: str = "send", stage: int = -1, feed: Feed | None = None,
              dram_bytes: float = 0.0) -> np.ndarray:
        """Time a message of `call` to rank `dest` (no MPI): returns its header
        (`net.message`)."""
        return send(self.tl, self.net, self.device, self.devices[dest], nbytes, after,
                    call.protocol, label=label, peer=self.devices[dest], stage=stage,
                    dram_bytes=dram_bytes,
                    feed=feed, share=call.share, algorithm=call.algorithm)

    def arrival(self, source: int, header: np.ndarray) -> SimTime:
        """When a message from rank `source` with this header is here (ingress reserved)."""
        return arrival(self.tl, self.net, self.devices[source], self.device, header,
                       peer=self.devices[source])

    # ---- messages ------------------------------------------------------------------------
    def post(self, header: np.ndarray, buf: np.ndarray | None, dest: int, tag: int
             ) -> list[MPI.Request]:
        """Send a timed message's header and (when numerics are on) its payload."""
        if self.tl.fault == "collective":
            self.tl.fault = ""
            raise RuntimeError("injected failure inside a collective (debug.fail_at)")
        reqs = [self.comm.Isend(header, dest, tag)]
        if buf is not None:
            reqs.append(self.comm.Isend(buf, dest, tag))
        return reqs

    def isend(self, buf: np.ndarray | None, dest: int, tag: int, nbytes: float,
              after: SimTime, call: Call = P2P, *, label: str = "send", stage: int = -1,
              feed: Feed | None = None, dram_bytes: float = 0.0) -> SendHandle:
        """Send `buf` (None: header only), a message of `call`, that is ready at `after`.

        `feed(start)`: the least time the sender needs to produce the bytes (a reduction
        streamed into the send); the port is busy for the longer of that and the wire time.
        """
        header = self.place(dest, nbytes, after, call, label=label, stage=stage, feed=feed,
                            dram_bytes=dram_bytes)
        return SendHandle(self.post(header, buf, dest, tag), header)

    def irecv(self, buf: np.ndarray | None, source: int, tag: int, posted: SimTime,
              nbytes: float | None = None) -> RecvHandle:
        """Post a receive into `buf` (None: header only), posted at emulated time `posted`
        (`nbytes`: what the sender must send, checked when the sender is a mirrored image)."""
        header = np.empty(HEADER_LEN)
        if isinstance(self.comm, FoldedComm):        # folded: the header of a sender's image
            reqs, fill = self.comm.receive(header, source, tag, nbytes)
            return RecvHandle(self, reqs, header, posted, source, fill=fill)
        reqs = [self.comm.Irecv(header, source, tag)]
        if buf is not None:
            reqs.append(self.comm.Irecv(buf, source, tag))
        return RecvHandle(self, reqs, header, posted, source)

"""Emulated time of one rank: resources with free times, ops placed by dependencies.

An op starts at the latest of its dependencies' ends and the free times of the resources it
occupies, and lasts as long as the device's cost says (DESIGN.md, Emulated time). Each
resource is a stream: ops on it are placed in issue order, so a rank's clock never goes back.
Nothing here reads the wall clock except to annotate events.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterable, Iterator, NamedTuple, Sequence

from .calendar import PortCalendar
from .events import CATS, PHASES
from .sms import SmShare
from .trace import TraceWriter

SimTime = float
COMPUTE = "compute"


class Span(NamedTuple):
    """Where an op landed in emulated time."""

    t_start: SimTime
    t_end: SimTime

    @property
    def duration(self) -> SimTime:
        return self.t_end - self.t_start


class Labels(NamedTuple):
    """Context attached to every event: which layer, phase and iteration it belongs to."""

    layer: int = -1
    phase: str = "none"
    iteration: int = -1


def latest(after: SimTime | Iterable[SimTime]) -> SimTime:
    """The latest of one or several dependency times (0 when there are none)."""
    if isinstance(after, (int, float)):
        return float(after)
    return max(after, default=0.0)


class Timeline:
    """Per-rank resource clocks (streams in issue order, network ports as calendars) plus
    the event recorder."""

    def __init__(self, writer: TraceWriter | None = None) -> None:
        self.free: dict[str, SimTime] = {}
        self.ports: dict[str, PortCalendar] = {}
        self.horizon: SimTime = 0.0     # latest end of a recorded summary (a collective)
        self.sms = SmShare()            # SMs held by this rank's collective kernels
        self.labels = Labels()
        self.writer = writer
        self.fault = ""                 # "collective": the next message raises (debug.fail_at)
        self._wall0 = time.perf_counter()

    def occupy(self, port: str, ready: SimTime, busy: SimTime) -> tuple[SimTime, SimTime]:
        """Reserve `busy` seconds of a network port's idle time from `ready` on (gaps
        filled in issue order, `sim.calendar`); returns (start, end)."""
        cal = self.ports.get(port)
        if cal is None:
            cal = self.ports[port] = PortCalendar()
        return cal.occupy(ready, busy)

    def port_idle(self, port: str, t: SimTime) -> SimTime:
        """The first instant >= t at which a port is idle."""
        cal = self.ports.get(port)
        return t if cal is None else cal.first_idle(t)

    def free_at(self, resource: str) -> SimTime:
        return self.free.get(resource, 0.0)

    def now(self) -> SimTime:
        """The latest time any resource of this rank is busy until."""
        return max([self.horizon, *self.free.values(),
                    *(c.busy_until() for c in self.ports.values())])

    def earliest(self, resources: Sequence[str], after: SimTime | Iterable[SimTime] = 0.0
                 ) -> SimTime:
        """When an op on `resources` that depends on `after` could start."""
        return max([latest(after)] + [self.free_at(r) for r in resources])

    def reserve(self, name: str, resources: Sequence[str], duration: SimTime,
                after: SimTime | Iterable[SimTime] = 0.0, *, cat: str = "compute",
                flops: float = 0.0, nbytes: int = 0, dram_bytes: float = 0.0, peer: int = -1,
                stage: int = -1, wall_start: float | None = None) -> Span:
        """Place an op: start = max(deps, resources free), end = start + duration."""
        if duration < 0:
            raise ValueError(f"op {name!r}: negative duration {duration}")
        start = self.earliest(resources, after)
        return self.place(name, resources, start, start + duration, cat=cat, flops=flops,
                          nbytes=nbytes, dram_bytes=dram_bytes, peer=peer, stage=stage,
                          wall_start=wall_start)

    def place(self, name: str, resources: Sequence[str], t_start: SimTime, t_end: SimTime, *,
              cat: str = "compute", flops: float = 0.0, nbytes: int = 0,
              dram_bytes: float = 0.0, peer: int = -1, stage: int = -1,
              wall_start: float | None = None) -> Span:
        """Record an op whose times were decided elsewhere; resources advance to its end."""
        for r in resources:
            if t_start < self.free_at(r) - 1e-15 * max(1.0, t_start):
                raise ValueError(f"op {name!r} starts at {t_start} before {r} is free "
                                 f"at {self.free_at(r)}")
            self.free[r] = max(self.free_at(r), t_end)
        self.record(name, cat, "+".join(resources), t_start, t_end, flops, nbytes,
                    dram_bytes, peer, stage, wall_start)
        return Span(t_start, t_end)

    def record(self, name: str, cat: str, resource: str, t0: SimTime, t1: SimTime,
                flops: float, nbytes: int, dram_bytes: float, peer: int, stage: int,
                wall_start: float | None) -> None:
        w = self.writer
        if w is None:
            return
        lab, codes = self.labels, w.strings
        now = time.perf_counter() - self._wall0      # wall seconds: annotation only
        w.add((codes[name], CATS[cat], codes[resource], t0, t1,
               now if wall_start is None else wall_start, now, flops, int(nbytes),
               int(dram_bytes), lab.layer, PHASES[lab.phase], lab.iteration, peer, stage))

    def summary(self, name: str, span: Span, *, cat: str = "collective", resource: str = "-",
                nbytes: int = 0, peer: int = -1, flops: float = 0.0, dram_bytes: float = 0.0,
                stage: int = -1) -> None:
        """Record a span that groups finer events (a whole collective); occupies nothing,
        but `now()` is never before its end (its last message arrived then)."""
        self.horizon = max(self.horizon, span.t_end)
        self.record(name, cat, resource, span.t_start, span.t_end, flops, nbytes, dram_bytes,
                     peer, stage, None)

    @contextmanager
    def labelled(self, **labels: object) -> Iterator[None]:
        """Attach layer / phase / iteration labels to the events recorded inside."""
        old = self.labels
        self.labels = old._replace(**labels)  # type: ignore[arg-type]
        try:
            yield
        finally:
            self.labels = old

"""A shared port's busy time: reservations fill idle gaps in the order they are issued.

A network port (a switch port, a NIC, a link direction) carries every flow of its device,
whatever communicator it belongs to. Flows are reserved in program (issue) order; a new flow
starts at the first idle instant at or after it is ready and occupies the port's idle time
from there, split around earlier reservations if it must be, until it has had its busy
time (`docs/network.md`, "Sharing model"). So concurrent flows share the port's bandwidth:
two equal flows ready together on one port end at 1x and 2x their transfer time (an
aggregate of exactly the port's rate), and a later small flow slips into an earlier flow's
gaps instead of queueing behind its end. Deterministic: the result depends only on the
order of the calls, which is the program's order on this rank.
"""
from __future__ import annotations

import bisect

MAX_INTERVALS = 512   # older gaps are closed (counted busy) beyond this: bounded memory


class PortCalendar:
    """Busy intervals of one port, sorted and disjoint."""

    __slots__ = ("starts", "ends")

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []

    def _gap(self, t: float) -> tuple[int, float]:
        """(index of the first interval after the gap the port is idle in from t on, the
        first instant >= t at which the port is idle)."""
        i = bisect.bisect_right(self.starts, t)
        return i, self.ends[i - 1] if i and self.ends[i - 1] > t else t

    def first_idle(self, t: float) -> float:
        """The first instant >= t at which the port is idle."""
        return self._gap(t)[1]

    def occupy(self, ready: float, busy: float) -> tuple[float, float]:
        """Reserve `busy` seconds of idle time from `ready` on; returns (start, end)."""
        starts, ends = self.starts, self.ends
        i, start = self._gap(ready)
        if busy <= 0.0:
            return start, start
        if i == len(starts) or busy <= starts[i] - start:   # the usual case: one piece
            end = start + busy
            self._insert(i, start, end)
            return start, end
        t, left = start, busy
        pieces: list[tuple[float, float]] = []
        while left > 0.0:
            gap_end = starts[i] if i < len(starts) else float("inf")
            take = min(left, gap_end - t)
            if take > 0.0:
                pieces.append((t, t + take))
                left -= take
            if left > 0.0:
                t = ends[i]
                i += 1
        for a, b in pieces:
            self._insert(bisect.bisect_left(starts, a), a, b)
        return start, pieces[-1][1]

    def _insert(self, i: int, a: float, b: float) -> None:
        """Add [a, b) at position i (disjoint from every interval), merging touching
        neighbours; beyond MAX_INTERVALS the oldest gap counts as busy (bounded memory)."""
        starts, ends = self.starts, self.ends
        n = len(starts)
        if i and ends[i - 1] == a:
            i -= 1
            ends[i] = b
        else:
            starts.insert(i, a)
            ends.insert(i, b)
            n += 1
        j = i + 1
        if j < n and starts[j] == b:             # ends[i] is b either way
            ends[i] = ends[j]
            del starts[j], ends[j]
            n -= 1
        if n > MAX_INTERVALS:
            ends[0] = ends[1]                    # close the oldest gap
            del starts[1], ends[1]

    def busy_until(self) -> float:
        """End of the last reservation (0 when none)."""
        return self.ends[-1] if self.ends else 0.0

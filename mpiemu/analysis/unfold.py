"""Expanding a folded run: every emulated rank gets its trace back.

A folded run (`comm.mirror`) writes one file per (CP rank, pipeline stage), standing for its
tp x dp images. The image of member (a, c, b, p) is the representative's trace with every
device renamed by `Fold.image` (ports `port.<d>`, NICs `nic.<d>`, links `link.<a>><b>`) and
every message's peer renamed to its image's rank in the same group; times are the same,
which is what makes folding exact. The events array is shared, not copied.

A message between two CP ranks of one DP replica names the same route and the same peer
whether it went on the CP group or the DP x CP group (where the peer's rank is c + cp d):
the trace does not say which. Such a peer is taken as a CP group's, so an image in another
DP replica (d > 0) shows DP x CP ring messages between CP neighbours with peer c, where
the unfolded run records c + cp d; times, bytes, names and routes are exact.
"""
from __future__ import annotations

import re
from typing import Any, Callable

import numpy as np

from ..comm.shape import Fold, GridShape
from .rank_trace import RankTrace

_DEVICE = re.compile(r"((?:port|nic)\.)(\d+)(\.)|(link\.)(\d+)>(\d+)")
_ROUTE = re.compile(r"^(in:)?(?:port|nic|link)\.(\d+)[.>](?:out>(?:port|nic)\.)?(\d+)?")


def _rename(text: str, g: Callable[[int], int]) -> str:
    def sub(m: re.Match[str]) -> str:
        if m.group(1):
            return f"{m.group(1)}{g(int(m.group(2)))}{m.group(3)}"
        return f"{m.group(4)}{g(int(m.group(5)))}>{g(int(m.group(6)))}"
    return _DEVICE.sub(sub, text)


def _peer_device(resource: str) -> tuple[int, int] | None:
    """(this rank's device, the peer's device) of a message event's route, or None."""
    m = _ROUTE.match(resource)
    if m is None or m.group(3) is None:
        return None
    a, b = int(m.group(2)), int(m.group(3))
    return (b, a) if m.group(1) else (a, b)


def _peer_index(shape: GridShape, me: int, peer: int) -> int | None:
    """The peer's rank in the group the two share (TP, CP, DP or DP x CP); None where it is
    the same for every image (pipeline and embedding peers, CP peers)."""
    t0, d0, p0 = shape.coords(me)
    t1, d1, p1 = shape.coords(peer)
    c0, c1 = shape.cp_rank(me), shape.cp_rank(peer)
    if p0 != p1 or (c0 != c1 and d0 == d1):
        return None
    if c0 == c1 and d0 == d1:
        return t1
    return c1 + shape.cp * d1 if shape.cp > 1 else d1


class _Images:
    """One representative's decoded resources, reused for each of its images."""

    def __init__(self, rt: RankTrace, shape: GridShape) -> None:
        self.rt, self.shape = rt, shape
        self.uniq, self.inv = np.unique(rt.resources.astype(str), return_inverse=True)
        self.routes = [_peer_device(u) for u in self.uniq]

    def image(self, member: int, g: Callable[[int], int]) -> RankTrace:
        rt, shape = self.rt, self.shape
        renamed = np.array([_rename(u, g) for u in self.uniq], dtype=object)
        peers = np.full(len(self.uniq), -1, np.int64)
        for i, route in enumerate(self.routes):
            if route is not None:
                k = _peer_index(shape, g(route[0]), g(route[1]))
                peers[i] = -1 if k is None else k
        events = rt.events
        per_event = peers[self.inv] if len(self.inv) else np.empty(0, np.int64)
        if np.any(per_event >= 0):
            events = events.copy()
            keep = per_event < 0
            events["peer"] = np.where(keep, events["peer"], per_event)
        t, d, p = shape.coords(member)      # an image keeps its representative's CP rank
        attrs: dict[str, Any] = rt.attrs | {"rank": member, "tp_rank": t, "dp_rank": d,
                                            "pp_rank": p, "image_of": rt.rank}
        return RankTrace(member, attrs, events, rt.table, rt.names, renamed[self.inv],
                         rt.cats, rt.phases)


def expand(ranks: list[RankTrace], manifest: dict[str, Any]) -> list[RankTrace]:
    """Every emulated rank of a folded run (ranks as they are when it is not folded)."""
    folded = manifest.get("folded")
    grid = manifest.get("grid")
    if not isinstance(folded, dict) or not isinstance(grid, dict):
        return ranks
    shape = GridShape(int(grid["tp"]), int(grid["dp"]), int(grid.get("pp", 1)),
                      int(grid.get("cp", 1)))
    fold = Fold(shape)
    out: list[RankTrace] = []
    for rt in ranks:
        images = _Images(rt, shape)
        for m in folded.get(str(rt.rank), [rt.rank]):
            out.append(rt if m == rt.rank else images.image(m, fold.image(m)))
    return sorted(out, key=lambda r: r.rank)


def timeline_differences(a: list[RankTrace], b: list[RankTrace], peers: bool = True
                         ) -> list[str]:
    """Where two runs' emulated timelines differ, rank by rank (times, bytes, peers unless
    `peers` is False, names and routes compared exactly); empty when they are bit-identical
    (folded vs unfolded)."""
    ra, rb = [r.rank for r in a], [r.rank for r in b]
    if ra != rb:
        return [f"ranks differ: {ra[:8]}... vs {rb[:8]}..."]
    out = []
    fields = ("t_start", "t_end", "bytes", "peer", "stage") if peers else \
        ("t_start", "t_end", "bytes", "stage")
    for x, y in zip(a, b):
        if len(x.events) != len(y.events):
            out.append(f"rank {x.rank}: {len(x.events)} vs {len(y.events)} events")
            continue
        for f in fields:
            if not np.array_equal(x.events[f], y.events[f]):
                i = int(np.argmax(x.events[f] != y.events[f]))
                out.append(f"rank {x.rank}: {f} of event {i} ({x.names[i]}) "
                           f"{x.events[f][i]!r} vs {y.events[f][i]!r}")
                break
        else:
            for what, u, v in (("name", x.names, y.names), ("route", x.resources, y.resources)):
                if not np.array_equal(u, v):
                    i = int(np.argmax(u != v))
                    out.append(f"rank {x.rank}: {what} of event {i} {u[i]!r} vs {v[i]!r}")
                    break
    return out

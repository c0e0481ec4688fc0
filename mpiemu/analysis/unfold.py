"""Expanding a folded run: every emulated rank gets its trace back.

A folded run (`comm.folded`) writes one file per class of exact images, standing for its
members. A member's trace is its representative's with every device shifted as the member
is shifted from it in TP and DP (`GridShape.image_map`): ports `port.<d>`, NICs `nic.<d>`, links `link.<a>><b>` and
each message's `peer` (the device at the other end); times are the same, which is what
makes folding exact. The events array is shared, not copied, where no peer is renamed.
"""
from __future__ import annotations

import re
from typing import Any, Callable

import numpy as np

from ..comm.shape import GridShape
from .rank_trace import RankTrace

_DEVICE = re.compile(r"((?:port|nic)\.)(\d+)(\.)|(link\.)(\d+)>(\d+)")


def _rename(text: str, g: Callable[[int], int]) -> str:
    def sub(m: re.Match[str]) -> str:
        if m.group(1):
            return f"{m.group(1)}{g(int(m.group(2)))}{m.group(3)}"
        return f"{m.group(4)}{g(int(m.group(5)))}>{g(int(m.group(6)))}"
    return _DEVICE.sub(sub, text)


class _Images:
    """One representative's decoded resources and peers, reused for each of its images."""

    def __init__(self, rt: RankTrace) -> None:
        self.rt = rt
        self.uniq, self.inv = np.unique(rt.resources.astype(str), return_inverse=True)
        self.peers, self.peer_inv = np.unique(rt.events["peer"], return_inverse=True)

    def image(self, member: int, shape: GridShape, g: Callable[[int], int]) -> RankTrace:
        rt = self.rt
        renamed = np.array([_rename(u, g) for u in self.uniq], dtype=object)
        events = rt.events
        moved = np.array([g(int(d)) if d >= 0 else int(d) for d in self.peers], np.int64)
        if not np.array_equal(moved, self.peers):
            events = events.copy()
            events["peer"] = moved[self.peer_inv]
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
    out: list[RankTrace] = []
    for rt in ranks:
        images = _Images(rt)
        for m in folded.get(str(rt.rank), [rt.rank]):
            out.append(rt if m == rt.rank else
                       images.image(m, shape, shape.image_map(rt.rank, m)))
    return sorted(out, key=lambda r: r.rank)


def timeline_differences(a: list[RankTrace], b: list[RankTrace]) -> list[str]:
    """Where two runs' emulated timelines differ, rank by rank (times, bytes, peers, names
    and routes compared exactly); empty when they are bit-identical (folded vs unfolded)."""
    ra, rb = [r.rank for r in a], [r.rank for r in b]
    if ra != rb:
        return [f"ranks differ: {ra[:8]}... vs {rb[:8]}..."]
    out = []
    fields = ("t_start", "t_end", "bytes", "peer", "stage")
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

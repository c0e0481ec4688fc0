"""One rank's trace in memory: its events and string table, names decoded on first use."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..sim.events import CATS, PHASES

CAT_NAMES = {v: k for k, v in CATS.items()}
PHASE_NAMES = {v: k for k, v in PHASES.items()}
_CAT_TABLE = np.array([CAT_NAMES[c] for c in range(len(CATS))], dtype=object)
_PHASE_TABLE = np.array([PHASE_NAMES[p] for p in range(len(PHASES))], dtype=object)


@dataclass
class RankTrace:
    """One rank's events and its string table; names, resources, categories and phases
    decoded per event on first use (the live per-iteration report tests codes instead, so
    it never holds the decoded arrays: `is_cat`, `is_phase`, `resource_in`)."""

    rank: int
    attrs: dict[str, Any]
    events: np.ndarray
    table: np.ndarray                        # the rank's strings, by code (object)
    # decoded per event, made on first use unless given (a folded image shares its
    # representative's, with its own resources)
    _names: np.ndarray | None = field(default=None, repr=False)
    _resources: np.ndarray | None = field(default=None, repr=False)
    _cats: np.ndarray | None = field(default=None, repr=False)
    _phases: np.ndarray | None = field(default=None, repr=False)

    @property
    def names(self) -> np.ndarray:
        if self._names is None:
            self._names = self.table[self.events["name"]]
        return self._names

    @property
    def resources(self) -> np.ndarray:
        if self._resources is None:
            self._resources = self.table[self.events["resource"]]
        return self._resources

    @property
    def cats(self) -> np.ndarray:
        if self._cats is None:
            self._cats = _CAT_TABLE[self.events["cat"].astype(int)]
        return self._cats

    @property
    def phases(self) -> np.ndarray:
        if self._phases is None:
            self._phases = _PHASE_TABLE[self.events["phase"].astype(int)]
        return self._phases

    def is_cat(self, cat: str, idx: np.ndarray | None = None) -> np.ndarray:
        """Whether each event (of `idx`, or all) is of category `cat` (codes compared; an
        unknown category matches nothing)."""
        return self._coded("cat", CATS.get(cat), idx)

    def is_phase(self, phase: str, idx: np.ndarray | None = None) -> np.ndarray:
        """Whether each event (of `idx`, or all) is of phase `phase`, as `is_cat`."""
        return self._coded("phase", PHASES.get(phase), idx)

    def _coded(self, fld: str, code: int | None, idx: np.ndarray | None) -> np.ndarray:
        codes = self.events[fld] if idx is None else self.events[fld][idx]
        return codes == code if code is not None else np.zeros(len(codes), bool)

    def resource_in(self, names: tuple[str, ...], idx: np.ndarray | None = None
                    ) -> np.ndarray:
        """Whether each event's resource (of `idx`, or all) is one of `names`: by code,
        unless the resources were given decoded (a folded image's)."""
        if self._resources is not None:
            res = self._resources
            return np.isin(res if idx is None else res[idx], names)
        codes = self.events["resource"] if idx is None else self.events["resource"][idx]
        hit = [c for c, s in enumerate(self.table) if s in names]
        return np.isin(codes, np.asarray(hit, dtype=codes.dtype))

    @property
    def complete(self) -> bool:
        return bool(self.attrs.get("complete", False))

    def select(self, *, cat: str | None = None, name: str | None = None,
               prefix: str | None = None, phase: str | None = None) -> np.ndarray:
        """Boolean mask of events matching all the given filters."""
        mask = np.ones(len(self.events), bool)
        if cat is not None:
            mask &= self.is_cat(cat)
        if name is not None:
            mask &= self.names == name
        if prefix is not None:
            mask &= self.name_startswith((prefix,))
        if phase is not None:
            mask &= self.is_phase(phase)
        return mask

    def by_resource(self) -> list[tuple[str, np.ndarray]]:
        """Each distinct resource (in code order) with its events' indices, ascending: one
        stable sort of the codes, not a scan of every event per resource."""
        codes = self.events["resource"]
        order = np.argsort(codes, kind="stable")
        bounds = np.flatnonzero(np.diff(codes[order])) + 1
        return [(str(self.resources[g[0]]), g)
                for g in (np.split(order, bounds) if len(order) else [])]

    def name_startswith(self, prefixes: tuple[str, ...],
                        idx: np.ndarray | None = None) -> np.ndarray:
        """Whether each event's name (of `idx`, or all) starts with one of `prefixes`: tested
        once per string of the table, then looked up by code (no per-event string copies; and
        no `np.unique`, whose first plain call imports `numpy.ma`, 10 ms on a running rank)."""
        codes = self.events["name"] if idx is None else self.events["name"][idx]
        hit = np.fromiter((str(n).startswith(prefixes) for n in self.table), bool,
                          len(self.table))
        return hit[codes]


def make_trace(attrs: dict[str, Any], events: np.ndarray, strings: list[Any]) -> RankTrace:
    """A RankTrace from raw rows and the rank's string table (decoded on first use)."""
    table = np.array([x.decode() if isinstance(x, bytes) else x for x in strings] or [""],
                     dtype=object)
    return RankTrace(int(attrs.get("rank", -1)), attrs, events, table)

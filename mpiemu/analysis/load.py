"""Reading a run directory back: manifest, per-rank traces with names decoded."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from ..sim.events import CATS, PHASES

CAT_NAMES = {v: k for k, v in CATS.items()}
PHASE_NAMES = {v: k for k, v in PHASES.items()}


@dataclass
class RankTrace:
    """One rank's events; `name` and `resource` decoded to strings."""

    rank: int
    attrs: dict[str, Any]
    events: np.ndarray
    names: np.ndarray            # decoded name per event
    resources: np.ndarray        # decoded resource per event
    cats: np.ndarray             # category name per event
    phases: np.ndarray           # phase name per event

    @property
    def complete(self) -> bool:
        return bool(self.attrs.get("complete", False))

    def select(self, *, cat: str | None = None, name: str | None = None,
               prefix: str | None = None, phase: str | None = None) -> np.ndarray:
        """Boolean mask of events matching all the given filters."""
        mask = np.ones(len(self.events), bool)
        if cat is not None:
            mask &= self.cats == cat
        if name is not None:
            mask &= self.names == name
        if prefix is not None:
            mask &= np.char.startswith(self.names.astype(str), prefix)
        if phase is not None:
            mask &= self.phases == phase
        return mask


@dataclass
class Run:
    """A whole run directory."""

    path: Path
    manifest: dict[str, Any]
    ranks: list[RankTrace] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return all(r.complete for r in self.ranks) and self.manifest.get("status") == "complete"

    @property
    def makespan(self) -> float:
        """Emulated time at which the last op of any rank ends."""
        ends = [float(r.events["t_end"].max()) for r in self.ranks if len(r.events)]
        return max(ends, default=0.0)


def _attr(v: Any) -> Any:
    if isinstance(v, bytes):
        v = v.decode()
    if isinstance(v, str) and v[:1] in "{[":
        try:
            return json.loads(v)
        except ValueError:
            return v
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, np.generic):
        return v.item()
    return v


def read_rank(path: Path, first_event: int = 0) -> RankTrace:
    """Read one `rank-NNNNN.h5` (complete or not), from event `first_event` on (a running
    job reads back only what its last iteration appended)."""
    with h5py.File(path, "r") as f:
        attrs = {k: _attr(v) for k, v in f.attrs.items()}
        events = f["events"][first_event:]
        strings = np.array([s.decode() if isinstance(s, bytes) else s
                            for s in f["strings"][()]], dtype=object)
    if len(strings) == 0:
        strings = np.array([""], dtype=object)
    cats = np.array([CAT_NAMES[int(c)] for c in range(len(CATS))], dtype=object)
    phases = np.array([PHASE_NAMES[int(p)] for p in range(len(PHASES))], dtype=object)
    return RankTrace(int(attrs.get("rank", -1)), attrs, events,
                     strings[events["name"]], strings[events["resource"]],
                     cats[events["cat"].astype(int)], phases[events["phase"].astype(int)])


def load(run_dir: str | Path) -> Run:
    """Load a run directory written by `mpiemu run` (for notebooks and the CLI)."""
    path = Path(run_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"run directory {path} does not exist")
    mpath = path / "manifest.json"
    manifest = json.loads(mpath.read_text()) if mpath.exists() else {}
    files = sorted(path.glob("rank-*.h5"))
    if not files:
        raise FileNotFoundError(f"{path} holds no rank-*.h5 traces")
    return Run(path, manifest, [read_rank(f) for f in files])

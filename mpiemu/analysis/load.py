"""Reading a run directory back: manifest, per-rank traces with names decoded."""
from __future__ import annotations

import json
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from .._proc import alive
from ..sim.events import EVENT_DTYPE
from ..sim.trace import part_files
from .rank_trace import RankTrace, make_trace
from .unfold import expand as expand_ranks

class TraceError(ValueError):
    """A run directory that cannot be analysed as it is: names the file and the problem."""


@dataclass
class Run:
    """A whole run directory; `problems` lists what `allow_incomplete` left out."""

    path: Path
    manifest: dict[str, Any]
    ranks: list[RankTrace] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    # a folded run shown by its representatives (too large to expand): rank -> its images
    stands_for: dict[int, list[int]] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return all(r.complete for r in self.ranks) and self.manifest.get("status") == "complete"

    def to_pandas(self) -> Any:
        """Every event of every rank as one pandas DataFrame (`mpiemu.open(...).events()`:
        times in seconds, names and categories as categoricals, the ranks' grid places)."""
        from .events_frame import events_frame  # noqa: PLC0415  (pandas only when asked)
        return events_frame(self.ranks)

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
    """Read one `rank-NNNNN.h5` and the part files a running or killed rank left beside it
    (`sim.trace`), from event `first_event` on."""
    blocks: list[np.ndarray] = []
    with h5py.File(path, "r") as f:
        attrs = {k: _attr(v) for k, v in f.attrs.items()}
        blocks.append(f["events"][first_event:])
        strings = list(f["strings"][()])
    merged = int(attrs.get("parts_merged", 0))
    for k, part in part_files(path):
        if k <= merged:
            continue
        with h5py.File(part, "r") as g:
            strings += list(g["strings"][()])
            first, ev = int(g.attrs["first_event"]), g["events"]
            if first + ev.shape[0] > first_event:
                blocks.append(ev[max(0, first_event - first):])
    events = np.concatenate(blocks) if len(blocks) > 1 else blocks[0]
    return make_trace(attrs, events, strings)


def _check(rt: RankTrace, path: Path, expected_rank: int) -> str | None:
    """What is wrong with a trace that did open (None: sound)."""
    ev = rt.events
    if rt.rank != expected_rank:
        return f"{path}: holds rank {rt.rank}, its name says {expected_rank}"
    if len(ev) and not (np.all(np.isfinite(ev["t_start"])) and np.all(np.isfinite(ev["t_end"]))):
        return f"{path}: events with non-finite times (NaN or inf)"
    if len(ev) and np.any(ev["t_end"] < ev["t_start"]):
        return f"{path}: events that end before they start"
    return None


def _read(path: Path, expected_rank: int) -> tuple[RankTrace | None, str | None]:
    try:
        rt = read_rank(path)
    except (OSError, KeyError, ValueError, TypeError, IndexError) as exc:
        return None, f"{path}: unreadable ({' '.join(str(exc).split()) or type(exc).__name__})"
    missing = set(EVENT_DTYPE.names or ()) - set(rt.events.dtype.names or ())
    if missing:
        return None, f"{path}: /events lacks fields {sorted(missing)}"
    return rt, _check(rt, path, expected_rank)


def _killed(path: Path, manifest: dict[str, Any]) -> str | None:
    """A manifest still `running` whose processes on this host are all gone: the job was
    killed before any rank could say so (SIGKILL of every rank, the OOM killer, a node
    reboot). None when it may be running, ran elsewhere or ended normally."""
    procs = manifest.get("processes")
    if manifest.get("status") != "running" or not isinstance(procs, list):
        return None
    here = socket.gethostname()
    mine = [int(p[1]) for p in procs if isinstance(p, list) and len(p) == 2 and p[0] == here]
    if len(mine) != len(procs) or any(alive(pid) for pid in mine):
        return None
    return (f"{path}: the manifest says 'running' but none of its {len(mine)} processes is "
            f"alive on {here}: the job was killed (SIGKILL, out of memory?); status: killed")


EXPAND_MAX_EVENTS = 4_000_000     # a folded run larger than this stays folded unless asked


def load(run_dir: str | Path, allow_incomplete: bool = False,
         expand: bool | None = None) -> Run:
    """Load a run directory written by `mpiemu run` (for notebooks and the CLI).

    Refuses, with a `TraceError` naming the file and the problem, a directory whose
    manifest is not JSON, whose rank files do not open or hold impossible events, or that
    lacks ranks its manifest names; `allow_incomplete=True` keeps what is sound instead
    and lists the rest in `Run.problems`. A folded run (`run.fold`) is expanded to every
    emulated rank (`analysis.unfold`) when that holds at most EXPAND_MAX_EVENTS events or
    `expand=True`; otherwise its representatives stand for their images (`Run.stands_for`:
    their timelines are identical, so every per-rank figure is theirs)."""
    path = Path(run_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"run directory {path} does not exist")
    problems: list[str] = []
    mpath = path / "manifest.json"
    manifest: dict[str, Any] = {}
    if mpath.exists():
        try:
            manifest = json.loads(mpath.read_text())
            if not isinstance(manifest, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as exc:
            problems.append(f"{mpath}: not a readable JSON manifest ({exc})")
            manifest = {}
    if (killed := _killed(path, manifest)) is not None:
        problems.append(killed)
        manifest = manifest | {"status": "killed"}
    files = sorted(path.glob("rank-*.h5"))
    if not files:
        raise TraceError(f"{path} holds no rank-*.h5 traces (not a run directory?)")
    ranks = []
    for f in files:
        try:
            want = int(f.stem.split("-")[1])
        except (IndexError, ValueError):
            problems.append(f"{f}: not a rank-NNNNN.h5 name")
            continue
        rt, problem = _read(f, want)
        if problem:
            problems.append(problem)
        elif rt is not None:
            ranks.append(rt)
    world = manifest.get("world_size")
    folded = manifest.get("folded")
    folded = folded if isinstance(folded, dict) else {}     # file rank -> emulated ranks
    if isinstance(world, int):
        have = {int(f.stem.split("-")[1]) for f in files if f.stem.split("-")[1].isdigit()}
        files_of = {int(r) for r in folded} if folded else set(range(world))
        gone = sorted(files_of - have)
        if gone:
            problems.append(f"{path}: rank files missing for ranks {gone} of the manifest's "
                            f"{world}")
    if problems and not allow_incomplete:
        raise TraceError(f"{problems[0]}; --allow-incomplete analyses what is sound"
                         + (f" ({len(problems) - 1} more problems)" if len(problems) > 1 else ""))
    if not ranks:
        raise TraceError(f"{path}: no rank trace is readable ({problems[0]})")
    images = {rt.rank: [int(m) for m in folded.get(str(rt.rank), [rt.rank])] for rt in ranks}
    total = sum(len(rt.events) * len(images[rt.rank]) for rt in ranks)
    if folded and (expand is False or (expand is None and total > EXPAND_MAX_EVENTS)):
        return Run(path, manifest, ranks, problems, images)
    return Run(path, manifest, expand_ranks(ranks, manifest), problems)

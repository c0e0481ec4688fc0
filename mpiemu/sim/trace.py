"""Per-rank HDF5 trace: events buffered in memory, appended in blocks, crash-tolerant.

The file is opened only while a block is appended and closed in between, so a rank that dies
leaves a file that opens and says `complete = False` (DESIGN.md, Traces). `complete` becomes
true only in `close(complete=True)` at a clean end.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import h5py
import numpy as np

from .events import EVENT_DTYPE, SCHEMA_VERSION, StringTable

STRING_DTYPE = h5py.string_dtype("utf-8")
CHUNK_EVENTS = 4096   # ~400 KiB per chunk of the compound dtype (h5py guide: 10 KiB-1 MiB)


def rank_file(run_dir: Path, rank: int) -> Path:
    """`rank-00003.h5` inside a run directory."""
    return Path(run_dir) / f"rank-{rank:05d}.h5"


class TraceWriter:
    """Append-only writer of one rank's `/events` table and `/strings` table."""

    def __init__(self, path: Path, attrs: Mapping[str, Any], block_events: int = 8192) -> None:
        self.path = Path(path)
        self.block_events = block_events
        self.strings = StringTable()
        self._rows: list[tuple[Any, ...]] = []
        self._n = 0
        with h5py.File(self.path, "w") as f:
            f.create_dataset("events", shape=(0,), maxshape=(None,), dtype=EVENT_DTYPE,
                             chunks=(CHUNK_EVENTS,), compression="gzip", compression_opts=4,
                             shuffle=True)
            f.create_dataset("strings", shape=(0,), maxshape=(None,), dtype=STRING_DTYPE,
                             chunks=(256,))
            f.attrs["schema_version"] = SCHEMA_VERSION
            f.attrs["time_unit"] = "s"
            f.attrs["clock"] = "emulated"
            f.attrs["complete"] = False
            for key, value in attrs.items():
                f.attrs[key] = _attr(value)

    def add(self, row: tuple[Any, ...]) -> None:
        """Buffer one event row (fields in EVENT_DTYPE order, names already coded)."""
        self._rows.append(row)
        if len(self._rows) >= self.block_events:
            self.flush()

    def flush(self) -> None:
        """Append buffered rows and new strings to the file, then close it."""
        new_strings = self.strings.take_new()
        if not self._rows and not new_strings:
            return
        block = np.array(self._rows, dtype=EVENT_DTYPE)
        self._rows.clear()
        with h5py.File(self.path, "r+") as f:
            if new_strings:
                s = f["strings"]
                s.resize((s.shape[0] + len(new_strings),))
                s[-len(new_strings):] = new_strings
            if len(block):
                ev = f["events"]
                ev.resize((self._n + len(block),))
                ev[self._n:] = block
                self._n += len(block)

    def close(self, complete: bool, attrs: Mapping[str, Any] | None = None) -> None:
        """Flush and set the final attributes; `complete` only at a clean end."""
        self.flush()
        with h5py.File(self.path, "r+") as f:
            for key, value in (attrs or {}).items():
                f.attrs[key] = _attr(value)
            f.attrs["complete"] = bool(complete)

    @property
    def n_events(self) -> int:
        return self._n + len(self._rows)


def _attr(value: Any) -> Any:
    """HDF5 attributes hold scalars, strings and flat arrays; anything else goes as JSON."""
    if isinstance(value, (str, bool, int, float, np.generic)):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) for v in value):
        return np.asarray(value)
    return json.dumps(value, sort_keys=True, default=str)


def write_merged(run_dir: Path, counts: list[int], name: str = "trace.h5") -> Path:
    """Rank 0's merged view: one virtual `/events` over all rank files, plus links to each.

    Codes in `name`/`resource` stay per rank; `/rank_offsets` says where each rank's rows
    start and `/ranks/<r>` links to that rank's file (for its string table).
    """
    run_dir = Path(run_dir)
    total = int(sum(counts))
    layout = h5py.VirtualLayout(shape=(total,), dtype=EVENT_DTYPE)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    for r, n in enumerate(counts):
        if n:
            src = h5py.VirtualSource(rank_file(run_dir, r).name, "events", shape=(n,))
            layout[offsets[r]:offsets[r + 1]] = src
    out = run_dir / name
    with h5py.File(out, "w") as f:
        f.create_virtual_dataset("events", layout)
        f.create_dataset("rank_offsets", data=offsets)
        grp = f.create_group("ranks")
        for r in range(len(counts)):
            grp[str(r)] = h5py.ExternalLink(rank_file(run_dir, r).name, "/")
        f.attrs["world_size"] = len(counts)
        f.attrs["schema_version"] = SCHEMA_VERSION
    return out

"""Per-rank HDF5 trace, crash-safe: a committed block of events is never rewritten.

`rank-00003.h5` is created at the start (attributes, empty tables). Each flush commits the
buffered events and the strings new since the last one as a part file
`rank-00003.h5.part-000001`, written under a temporary name and renamed into place (atomic on
POSIX), so a rank killed mid-write, or a full disk, loses at most the block being written and
never one already committed. A flush happens every `block_events` events, at the end of each
iteration (the runners call `flush`) and, looked at every `TICK_EVERY` events, at least
every `flush_interval_s` of wall time, so a killed rank loses at most about that much. A
clean `close(complete=True)` compacts the parts into the rank file (written under a
temporary name, renamed, then the parts deleted; the file's `parts_merged` attribute says
which parts it holds, so a kill between the rename and the deletes counts nothing twice).
`read_trace` is the reader's side (DESIGN.md, Traces).
"""
from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import h5py
import numpy as np

from .events import EVENT_DTYPE, SCHEMA_VERSION, StringTable

STRING_DTYPE = h5py.string_dtype("utf-8")
CHUNK_EVENTS = 4096   # ~400 KiB per chunk of the compound dtype (h5py guide: 10 KiB-1 MiB)
FLUSH_INTERVAL_S = 2.0
# the merge's chunk cache: room for the one chunk being filled (HDF5's default 1 MiB left
# about 8 MB more resident after a 200k-event compaction, measured; this, none)
MERGE_CACHE_BYTES = CHUNK_EVENTS * EVENT_DTYPE.itemsize * 3 // 2
TICK_EVERY = 64       # events between two looks at the wall clock (one costs as much as an add)
# deflate level of the rank files: on a 175B TP 8 rank's 9,731 events level 1 took 10.6 ms
# for 181 KB, level 4 21.0 ms for 176 KB (byte-shuffled first, as HDF5 recommends for records)
GZIP_LEVEL = 1


def commit(final: Path, write: Callable[[Path], object], tmp: Path | None = None) -> None:
    """Write `final` through `write(tmp)` and an atomic rename. A failed write (a full disk)
    removes its partial file, so what it took is free again for the manifest that reports the
    failure, and is raised as an OSError naming the file and the reason, without HDF5's
    details."""
    tmp = tmp or final.with_name(final.name + ".tmp")
    try:
        write(tmp)
        os.replace(tmp, final)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        code = exc.errno or errno.EIO
        if "No space left" in str(exc):
            code = errno.ENOSPC
        raise OSError(code, f"cannot write {final}: {os.strerror(code)}") from None


def rank_file(run_dir: Path, rank: int) -> Path:
    """`rank-00003.h5` inside a run directory."""
    return Path(run_dir) / f"rank-{rank:05d}.h5"


def part_files(path: Path) -> list[tuple[int, Path]]:
    """Committed part files of a rank file, in order (temporary files are not parts)."""
    out = []
    for p in Path(path).parent.glob(Path(path).name + ".part-*"):
        tail = p.name.rsplit(".part-", 1)[1]
        if tail.isdigit():
            out.append((int(tail), p))
    return sorted(out)


def _tables(f: h5py.File) -> None:
    f.create_dataset("events", shape=(0,), maxshape=(None,), dtype=EVENT_DTYPE,
                     chunks=(CHUNK_EVENTS,), compression="gzip", compression_opts=GZIP_LEVEL,
                     shuffle=True)
    f.create_dataset("strings", shape=(0,), maxshape=(None,), dtype=STRING_DTYPE,
                     chunks=(256,))


def _opened(first: h5py.File, paths: list[Path]) -> Iterator[h5py.File]:
    """`first`, then each of `paths` opened for reading in turn (closed after its turn)."""
    yield first
    for p in paths:
        with h5py.File(p, "r") as f:
            yield f


def _append(ds: h5py.Dataset, data: Any) -> None:
    n = ds.shape[0]
    ds.resize((n + len(data),))
    ds[n:] = data


class TraceWriter:
    """Append-only writer of one rank's `/events` and `/strings` tables (see the module)."""

    def __init__(self, path: Path, attrs: Mapping[str, Any], block_events: int = 8192,
                 flush_interval_s: float = FLUSH_INTERVAL_S) -> None:
        self.path = Path(path)
        self.block_events = block_events
        self.flush_interval_s = flush_interval_s
        self.strings = StringTable()
        self._rows: list[tuple[Any, ...]] = []
        self._n = 0
        self._part = 0
        self.fail_next_flush = False     # debug.fail_at = "flush" (context.maybe_fail)
        self._last_flush = time.monotonic()
        self._mark = 0                                  # n_events at the last mark()
        self._since_mark: list[tuple[int, Path]] = []  # (first event, part) since mark()
        for _, old in part_files(self.path):        # a rerun into the same directory
            old.unlink()
        with h5py.File(self.path, "w") as f:
            _tables(f)
            f.attrs["schema_version"] = SCHEMA_VERSION
            f.attrs["time_unit"] = "s"
            f.attrs["clock"] = "emulated"
            f.attrs["complete"] = False
            f.attrs["parts_merged"] = 0
            for key, value in attrs.items():
                f.attrs[key] = _attr(value)

    def add(self, row: tuple[Any, ...]) -> None:
        """Buffer one event row (fields in EVENT_DTYPE order, names already coded)."""
        self._rows.append(row)
        n = len(self._rows)
        if n >= self.block_events:
            self.flush()
        elif n % TICK_EVERY == 0:
            self.tick()

    def tick(self) -> None:
        """Commit if the last commit is older than the flush interval (runners call it at
        the end of each iteration: bounded loss, not one file per iteration)."""
        if time.monotonic() - self._last_flush >= self.flush_interval_s:
            self.flush()

    def flush(self) -> None:
        """Commit buffered rows and new strings as the next part file (atomic rename)."""
        self._last_flush = time.monotonic()
        new_strings = self.strings.take_new()
        if not self._rows and not new_strings:
            return
        block = np.array(self._rows, dtype=EVENT_DTYPE)
        self._rows.clear()
        self._part += 1
        final = self.path.with_name(f"{self.path.name}.part-{self._part:06d}")

        def write(tmp: Path) -> None:
            with h5py.File(tmp, "w") as f:
                f.create_dataset("events", data=block)
                f.create_dataset("strings", data=np.array(new_strings, dtype=object),
                                 dtype=STRING_DTYPE)
                f.attrs["first_event"] = self._n
            if self.fail_next_flush:      # debug.fail_at = "flush": die before the commit
                self.fail_next_flush = False
                raise RuntimeError("injected failure inside a trace flush (debug.fail_at)")
        commit(final, write)
        self._since_mark.append((self._n, final))
        self._n += len(block)

    def mark(self) -> None:
        """Remember where the events of the next iteration start (`since_mark`)."""
        self._mark = self.n_events
        self._since_mark = []

    def blocks_since_mark(self, fields: tuple[str, ...] | None = None
                          ) -> Iterator[np.ndarray]:
        """Events recorded since `mark` (committed or still buffered), only `fields` if
        given, a block at a time. Committed blocks are read back from their part files (just
        written: the page cache holds them), so a rank keeps no copy of its iteration in
        memory; the cost is linear in the iteration's events, flat over a long run."""
        names = list(fields or EVENT_DTYPE.names or ())
        at = self._since_mark[0][0] if self._since_mark else self._n
        for _, part in self._since_mark:
            with h5py.File(part, "r") as f:
                block = f["events"].fields(names)[()]
            yield block[max(0, self._mark - at):]
            at += len(block)
        if self._rows:
            rows = np.array(self._rows, dtype=EVENT_DTYPE)[max(0, self._mark - at):]
            block = np.empty(len(rows), dtype=[(n, EVENT_DTYPE[n]) for n in names])
            for n in names:
                block[n] = rows[n]
            yield block

    def close(self, complete: bool, attrs: Mapping[str, Any] | None = None) -> None:
        """Commit what is buffered; at a clean end (`complete`) compact the parts into the
        rank file with the final attributes. A failing rank leaves its parts as they are."""
        self.flush()
        if complete:
            self._compact(attrs or {})

    def _compact(self, attrs: Mapping[str, Any]) -> None:
        parts = part_files(self.path)
        commit(self.path, lambda tmp: self._merge(tmp, parts, attrs))
        for _, p in parts:
            p.unlink()

    def _merge(self, tmp: Path, parts: list[tuple[int, Path]],
               attrs: Mapping[str, Any]) -> None:
        """The rank file plus its parts into `tmp`: events part by part, the string table
        at the end in one write."""
        strings: list[Any] = []
        with h5py.File(self.path, "r") as src, \
                h5py.File(tmp, "w", rdcc_nbytes=MERGE_CACHE_BYTES) as dst:
            _tables(dst)
            for key, value in src.attrs.items():
                dst.attrs[key] = value
            events = dst["events"]          # held open: its chunk cache fills each chunk once
            for f in _opened(src, [p for _, p in parts]):
                _append(events, f["events"][()])
                strings.extend(f["strings"][()])
            _append(dst["strings"], np.array(strings, dtype=object))
            for key, value in attrs.items():
                dst.attrs[key] = _attr(value)
            dst.attrs["complete"] = True
            dst.attrs["parts_merged"] = parts[-1][0] if parts else 0

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


def write_merged(run_dir: Path, counts: dict[int, int], name: str = "trace.h5") -> Path:
    """Rank 0's merged view: one virtual `/events` over all rank files (`counts`: events per
    file rank, in rank order), plus links to each.

    Codes in `name`/`resource` stay per rank; `/rank_offsets` says where each file's rows
    start, `/file_ranks` which rank each file holds and `/ranks/<r>` links to that rank's
    file (for its string table).
    """
    run_dir = Path(run_dir)
    ranks = sorted(counts)
    sizes = [counts[r] for r in ranks]
    layout = h5py.VirtualLayout(shape=(int(sum(sizes)),), dtype=EVENT_DTYPE)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    for i, (r, n) in enumerate(zip(ranks, sizes)):
        if n:
            src = h5py.VirtualSource(rank_file(run_dir, r).name, "events", shape=(n,))
            layout[offsets[i]:offsets[i + 1]] = src
    out = run_dir / name
    with h5py.File(out, "w") as f:
        f.create_virtual_dataset("events", layout)
        f.create_dataset("rank_offsets", data=offsets)
        f.create_dataset("file_ranks", data=np.array(ranks, np.int64))
        grp = f.create_group("ranks")
        for r in ranks:
            grp[str(r)] = h5py.ExternalLink(rank_file(run_dir, r).name, "/")
        f.attrs["world_size"] = len(ranks)
        f.attrs["schema_version"] = SCHEMA_VERSION
    return out

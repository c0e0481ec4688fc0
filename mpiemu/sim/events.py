"""The trace event record: one row per emulated operation (DESIGN.md, Traces).

Names and resources are codes into a per-file string table; `cat` and `phase` are HDF5 enums,
so each file describes itself.
"""
from __future__ import annotations

import h5py
import numpy as np

SCHEMA_VERSION = 1
# "collective" rows summarise a whole collective (start to finish); its steps are "comm" rows.
CATS: dict[str, int] = {"compute": 0, "comm": 1, "memory": 2, "wait": 3, "collective": 4}
PHASES: dict[str, int] = {"none": 0, "fwd": 1, "bwd": 2, "optim": 3, "comm": 4,
                         "recompute": 5}
CAT_DTYPE = h5py.enum_dtype(CATS, basetype="u1")
PHASE_DTYPE = h5py.enum_dtype(PHASES, basetype="u1")

EVENT_DTYPE = np.dtype([
    ("name", "<u4"),          # code into /strings
    ("cat", CAT_DTYPE),
    ("resource", "<u4"),      # code into /strings
    ("t_start", "<f8"),       # emulated seconds
    ("t_end", "<f8"),
    ("wall_start", "<f8"),    # wall seconds since the run started on this rank
    ("wall_end", "<f8"),
    ("flops", "<f8"),
    ("bytes", "<u8"),         # bytes on the wire (comm) or moved (memory)
    ("dram_bytes", "<u8"),    # DRAM reads + writes the op causes on this device
    ("layer", "<i4"),
    ("phase", PHASE_DTYPE),
    ("iteration", "<i4"),
    ("peer", "<i4"),          # the other rank of a message, or -1
    ("stage", "<i4"),         # GEMM stage / ring step / bucket index, or -1
])


class StringTable(dict[str, int]):
    """Interns strings to stable integer codes (`table[s]`: a string's code, assigned on
    first use), remembering which codes are new."""

    def __init__(self) -> None:
        super().__init__()
        self._flushed = 0

    def __missing__(self, s: str) -> int:
        c = self[s] = len(self)
        return c

    def take_new(self) -> list[str]:
        """Strings interned since the last call, in code order."""
        names = list(self)[self._flushed:]
        self._flushed = len(self)
        return names

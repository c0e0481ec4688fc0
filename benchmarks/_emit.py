"""Shared output of the MPI benchmarks: rank 0 prints the table and optionally saves it."""
from __future__ import annotations

import sys
from pathlib import Path

from mpi4py import MPI


def emit(comm: MPI.Comm, lines: list[str], out: str | None) -> None:
    """Rank 0 writes the Markdown table to stdout and, if asked, to `out`."""
    if comm.Get_rank() != 0:
        return
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text)

"""mpiemu: an MPI job in which every rank plays one accelerator.

Ranks run the real numpy math of their shard of a transformer, move real bytes with ring
collectives over MPI, and are charged emulated time by the model of the hardware they play.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ._threads import limit_blas_threads, skip_ucx_memory_hooks

if TYPE_CHECKING:
    from .analysis.frames import RunFrames

limit_blas_threads()
skip_ucx_memory_hooks()

__version__ = "0.1.0"
__all__ = ["__version__", "open"]


def open(run_dir: str, expand: bool | None = None) -> "RunFrames":  # noqa: A001
    """A run directory's analyses as pandas DataFrames (`analysis.frames.RunFrames`:
    events, budgets, ops, breakdown, critical_path, network, compare); docs/api.md."""
    from .analysis.frames import open_run  # noqa: PLC0415  (no MPI, pandas on use)
    return open_run(run_dir, expand)

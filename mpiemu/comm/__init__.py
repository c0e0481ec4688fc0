"""Timed MPI communication: point-to-point (`p2p`), the ring engine (`ring`, `schedule`), the
tree (`tree`), collectives and their closed forms (`collectives`, `cost`), the TP x DP grid
(`grid`)."""
from .collectives import all_gather, all_reduce, chunk_bounds, reduce_scatter
from .p2p import TimedComm

__all__ = ["TimedComm", "all_gather", "all_reduce", "chunk_bounds", "reduce_scatter"]

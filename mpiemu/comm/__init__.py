"""Genuine communication: process grid, timestamped point-to-point, ring collectives."""
from .grid import GridShape, ProcessGrid
from .p2p import RecvHandle, SendHandle, TimedComm
from .ring import all_gather, all_reduce, chunk_bounds, reduce_scatter

__all__ = ["GridShape", "ProcessGrid", "RecvHandle", "SendHandle", "TimedComm", "all_gather",
           "all_reduce", "chunk_bounds", "reduce_scatter"]

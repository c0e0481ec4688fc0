"""Emulated time: per-rank resource clocks, event records, the HDF5 trace writer."""
from .events import CATS, EVENT_DTYPE, PHASES, SCHEMA_VERSION
from .timeline import COMPUTE, Labels, SimTime, Span, Timeline, latest
from .trace import TraceWriter, rank_file, write_merged

__all__ = ["CATS", "COMPUTE", "EVENT_DTYPE", "Labels", "PHASES", "SCHEMA_VERSION", "SimTime",
           "Span", "Timeline", "TraceWriter", "latest", "rank_file", "write_merged"]

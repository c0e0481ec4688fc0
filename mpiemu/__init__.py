"""mpiemu: an MPI job in which every rank plays one accelerator.

Ranks run the real numpy math of their shard of a transformer, move real bytes with ring
collectives over MPI, and are charged emulated time by the model of the hardware they play.
"""
from ._threads import limit_blas_threads, skip_ucx_memory_hooks

limit_blas_threads()
skip_ucx_memory_hooks()

__version__ = "0.1.0"
__all__ = ["__version__"]

"""`python -m mpiemu ...` is the same as the `mpiemu` console script."""
from .cli import entry

entry()

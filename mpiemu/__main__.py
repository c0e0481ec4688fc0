"""`python -m mpiemu ...` is the same as the `mpiemu` console script."""
from .run.cli import entry

entry()

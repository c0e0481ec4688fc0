"""`python -m mpiemu ...` is the same as the `mpiemu` console script."""
from .run.cli import main

raise SystemExit(main())

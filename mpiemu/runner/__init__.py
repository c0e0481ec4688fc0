"""One job on every rank: validate collectively, open the run directory and its traces, run
the workload's kind (`train`, `collectives`, `sublayers`, `layer_sweep`), close.

Nothing is imported here eagerly: `mpiemu devices` and `mpiemu analyze` must not start MPI.
"""

"""Configs (TOML -> validated dataclasses), the per-rank runner, reports and the CLI.

Nothing is imported here eagerly: `mpiemu devices` and `mpiemu analyze` must not start MPI.
"""

"""A workload's configuration: its TOML read into validated, frozen sections
(`workload.py`, one module per area's sections) and the preset listings of `mpiemu devices`."""

"""Workload sections owned by the layers they configure (one file per area)."""

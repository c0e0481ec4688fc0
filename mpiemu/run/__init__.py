"""Configs (TOML -> validated dataclasses), the per-rank runner and the CLI."""
from .config import Workload, load_workload
from .errors import ConfigError

__all__ = ["ConfigError", "Workload", "load_workload"]

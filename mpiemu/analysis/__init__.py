"""Reading traces back (one process): load, per-rank budgets, per-op totals."""
from .load import RankTrace, Run, load, read_rank
from .tables import OpTotal, RankBudget, format_tables, op_totals, rank_budget, union_length

__all__ = ["OpTotal", "RankBudget", "RankTrace", "Run", "format_tables", "load", "op_totals",
           "rank_budget", "read_rank", "union_length"]

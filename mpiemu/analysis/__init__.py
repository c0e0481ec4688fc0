"""Reading traces back (one process): load, per-rank budgets, per-op totals."""
from .breakdown import IterationBreakdown, format_breakdown, iteration_breakdown, run_breakdown
from .load import RankTrace, Run, load, read_rank
from .tables import OpTotal, RankBudget, format_tables, op_totals, rank_budget, union_length

__all__ = ["IterationBreakdown", "OpTotal", "format_breakdown", "iteration_breakdown",
           "run_breakdown", "RankBudget", "RankTrace", "Run", "format_tables", "load", "op_totals",
           "rank_budget", "read_rank", "union_length"]

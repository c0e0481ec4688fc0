"""Reading traces back (one process, no MPI): load, per-rank budgets, per-op totals,
breakdowns, critical path, network, exports."""
from .breakdown import IterationBreakdown, format_breakdown, iteration_breakdown, run_breakdown
from .critical_path import PathStep, critical_path
from .intervals import union_length
from .load import Run, load, read_rank
from .rank_trace import RankTrace
from .summary import format_tables, summary_dict
from .tables import OpTotal, RankBudget, op_totals, rank_budget

__all__ = ["IterationBreakdown", "OpTotal", "PathStep", "critical_path", "format_breakdown",
           "iteration_breakdown",
           "run_breakdown", "RankBudget", "RankTrace", "Run", "format_tables", "load", "op_totals",
           "rank_budget", "read_rank", "summary_dict", "union_length"]

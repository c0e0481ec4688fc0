"""A run's analyses as pandas DataFrames, in the style of Holistic Trace Analysis.

`mpiemu.open(run_dir)` returns a `RunFrames`; each method is one analysis and returns a
DataFrame whose rows carry the rank and its place in the grid (`tp_rank`, `dp_rank`,
`pp_rank`, and `cp_rank` with context parallelism), names and categories as pandas
categoricals (a few distinct strings over millions of events), times in seconds (`_s`).
The CLI's tables (`mpiemu analyze`) are computed by the same functions
(`analysis.tables`, `breakdown`, `critical_path`, `network`). pandas is needed here only.
"""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from .breakdown import run_breakdown
from .events_frame import events_frame, grid_frame, pandas as _pandas
from .critical_path import critical_path
from .load import Run, load
from .network import busiest_ports
from .tables import op_totals, rank_budget

class RunFrames:
    """One run (`analysis.load`), its analyses as DataFrames."""

    def __init__(self, run: Run) -> None:
        self.run = run

    @property
    def path(self) -> Path:
        return Path(self.run.path)

    @property
    def makespan_s(self) -> float:
        return self.run.makespan

    def grid(self) -> Any:
        """Each rank's place: rank, tp_rank, dp_rank, pp_rank (cp_rank with CP)."""
        return grid_frame(self.run.ranks)

    def _with_grid(self, df: Any) -> Any:
        return df.merge(self.grid(), on="rank", how="left") if "rank" in df else df

    def events(self) -> Any:
        """Every event of every rank: rank, grid place, name, cat, resource, phase,
        t_start_s, t_end_s, duration_s, flops, bytes, dram_bytes, layer, iteration, peer,
        stage; the strings as categoricals."""
        return events_frame(self.run.ranks)

    def budgets(self) -> Any:
        """Per rank: makespan, compute (union of compute ops), collectives, exposed
        communication, events, complete (`mpiemu analyze`'s first table)."""
        pd = _pandas()
        return self._with_grid(pd.DataFrame([asdict(rank_budget(rt)) for rt in self.run.ranks]))

    def ops(self) -> Any:
        """Per (name, cat) over every rank: count, total_s, bytes, flops, dram_bytes,
        largest total first (`mpiemu analyze`'s second table, every op)."""
        pd = _pandas()
        df = pd.DataFrame([asdict(o) for o in op_totals(self.run)],
                          columns=["name", "cat", "count", "total_s", "bytes", "flops",
                                   "dram_bytes"])
        return df.astype({"name": "category", "cat": "category"})

    def breakdown(self) -> Any:
        """Per rank and iteration: iteration_s, compute_s, tp / dp exposed and total,
        recompute_s, idle_s."""
        pd = _pandas()
        rows = [{"rank": rt.rank, **asdict(b), "iteration_s": b.iteration_s,
                 "idle_s": b.idle_s}
                for rt, per in zip(self.run.ranks, run_breakdown(self.run)) for b in per]
        df = pd.DataFrame(rows).rename(columns={"t_start": "t_start_s", "t_end": "t_end_s"})
        return self._with_grid(df)

    def critical_path(self) -> Any:
        """The ops (and idle gaps, name 'idle') on the run's critical path, in time order."""
        pd = _pandas()
        df = pd.DataFrame([s._asdict() for s in critical_path(self.run)],
                          columns=["rank", "name", "cat", "resource", "t_start", "t_end"])
        df = df.rename(columns={"t_start": "t_start_s", "t_end": "t_end_s"})
        df["duration_s"] = df["t_end_s"] - df["t_start_s"]
        df = df.sort_values("t_start_s", kind="stable", ignore_index=True)
        return self._with_grid(df.astype({"name": "category", "cat": "category"}))

    def network(self) -> Any:
        """The busiest port of each kind: kind, rank, port, busy_s, collective_s, nbytes,
        share (busy over the collectives' time)."""
        pd = _pandas()
        return pd.DataFrame([asdict(p) | {"share": p.share} for p in busiest_ports(self.run)])

    def compare(self, other: "RunFrames") -> Any:
        """Per (name, cat): total_s in this run (a_s) and in `other` (b_s), and their
        change (b - a), largest change first."""
        pd = _pandas()
        df = pd.concat([self._totals().rename("a_s"), other._totals().rename("b_s")],
                       axis=1).fillna(0.0)
        df["change_s"] = df["b_s"] - df["a_s"]
        order = df["change_s"].abs().sort_values(ascending=False, kind="stable").index
        return df.reindex(order).reset_index()

    def _totals(self) -> Any:
        pd = _pandas()
        ops = op_totals(self.run)
        return pd.Series([o.total_s for o in ops],
                         index=pd.MultiIndex.from_tuples([(o.name, o.cat) for o in ops],
                                                         names=["name", "cat"]))


def open_run(run_dir: str | Path, expand: bool | None = None) -> RunFrames:
    """A run directory's analyses as DataFrames (`expand`: as `analysis.load`)."""
    return RunFrames(load(run_dir, expand=expand))

"""`mpiemu report sunway` writes its Markdown, CSV, plots and a trace the analysis tools open."""
from __future__ import annotations

import csv
from pathlib import Path

from mpiemu.analysis import format_tables, load
from mpiemu.studies.sunway_report import main


def test_report_writes_tables_plots_and_an_analysable_trace(tmp_path: Path) -> None:
    assert main(tmp_path, ["--quick"]) == 0
    for name in ("README.md", "attention.csv", "schedule.csv", "fusion.csv", "speedup.png",
                 "schedule.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    rows = list(csv.DictReader((tmp_path / "attention.csv").open()))
    assert {r["dtype"] for r in rows} == {"fp32", "fp16"} and {r["pass_"] for r in rows} == {
        "fwd", "bwd"}
    run = load(tmp_path / "trace")
    assert run.complete
    resources = set(run.ranks[0].resources)
    assert {f"cg{c}" for c in range(6)} <= resources
    assert any("+" in r and r.startswith("cg") for r in resources)   # an op's CG list
    assert "layer0.bwd.attn.b" in "\n".join(format_tables(run))

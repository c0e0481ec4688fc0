"""`mpiemu report sunway`: SWattention vs standard attention and SwFormer scheduling, ours beside
the seeds' figures (SWA = seed 001, SwFormer appendix = seed 000).

Everything comes from `SunwayCost`, the model Sunway ranks use; one process suffices since the
costs are per processor. Writes README.md, attention.csv, seed.csv, schedule.csv, speedup.png,
schedule.png and a one-rank trace of a GPT-3 6.7B-like layer (trace/, for `mpiemu analyze`).
"""
from __future__ import annotations

import json
from pathlib import Path

from ..devices.presets import load_device
from ..devices.sunway import SunwayCost
from ..sim.timeline import Timeline
from ..sim.trace import TraceWriter, rank_file
from .common import Golden
from .sunway_rows import (SEQS, attention_rows, fusion_rows, layer_schedules, schedule_rows,
                          seed_rows)


def write_trace(m: SunwayCost, out: Path) -> Path:
    """One Sunway rank's GPT-3 6.7B-like layer, forward then backward under KA."""
    from ..executors.sunway import charge_schedule  # noqa: PLC0415
    run = out / "trace"
    run.mkdir(parents=True, exist_ok=True)
    writer = TraceWriter(rank_file(run, 0), {"rank": 0, "world_size": 1, "tp_rank": 0,
                                             "dp_rank": 0, "device": m.spec.name})
    tl = Timeline(writer)
    t = 0.0
    for p in ("fwd", "bwd"):
        ops, sc = layer_schedules(m, 4, p, coarse=True)
        with tl.labelled(layer=0, phase=p, iteration=0):
            t = charge_schedule(tl, sc["ka"], t, prefix=f"layer0.{p}.",
                                flops={o.name: o.flops for o in ops})
    writer.close(complete=True, attrs={"t_end_emulated": tl.now()})
    (run / "manifest.json").write_text(json.dumps(
        {"status": "complete", "world_size": 1, "config": {"name": "sunway-gpt3-6.7b-layer"},
         "note": "written by `mpiemu report sunway` from SunwayCost; one rank, KA"}, indent=2))
    return run


def golden() -> list[Golden]:
    """Every CSV of the study, regenerated in full (a few seconds: costs only, one process)."""
    m = SunwayCost(load_device("sw26010pro"))
    att = attention_rows(m, SEQS)
    return [Golden("attention.csv", att), Golden("seed.csv", seed_rows(m, att)),
            Golden("schedule.csv", schedule_rows(m)), Golden("fusion.csv", fusion_rows(m))]

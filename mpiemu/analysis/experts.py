"""Mixture of Experts in a run: tokens per expert and per rank (`routing.npz`, written by
every MoE run), the expert-parallel all-to-alls' time per rank, the wait uneven counts
caused there (each call's time beyond the fastest rank's same call: it waited for the
busiest peer) and the part hidden under the rank's compute (shared experts, or another
micro-batch's pass under the combined 1F1B schedule). DataFrames, as HTA's analyses
return."""
from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from .intervals import union_length
from .load import Run

ROUTING = "routing.npz"
A2A = ("dispatch", "combine", "dispatch.bwd", "combine.bwd")


def routing_counts(run: Run) -> np.ndarray | None:
    """counts[iteration, layer, rank, expert] (None: not an MoE run)."""
    path = run.path / ROUTING
    if not path.exists():
        return None
    with np.load(path) as f:
        return np.array(f["counts"])


def expert_load(run: Run) -> Any:
    """Per iteration and layer: tokens over every expert, the busiest expert's over the
    mean (1 is perfect balance), the busiest and idlest experts."""
    import pandas as pd  # noqa: PLC0415
    c = routing_counts(run)
    rows = []
    for it, layer in np.ndindex(*(c.shape[:2] if c is not None else (0, 0))):
        per = c[it, layer].sum(0) if c is not None else np.zeros(0)
        if per.sum() == 0:
            continue
        rows.append({"iteration": it, "layer": layer, "tokens": int(per.sum()),
                     "max_over_mean": float(per.max() / per.mean()),
                     "busiest_expert": int(per.argmax()), "idlest_expert": int(per.argmin())})
    return pd.DataFrame(rows)


def rank_all_to_all(run: Run) -> Any:
    """Per rank: tokens it routed (summed over the run), its EP all-to-all calls' time, the
    part of it spent waiting beyond the fastest rank's same call, and the part its compute
    stream was busy meanwhile (hidden: |A and C| = |A| + |C| - |A or C| of the calls' and
    the compute's intervals)."""
    import pandas as pd  # noqa: PLC0415
    c = routing_counts(run)
    calls: dict[tuple[str, int, int], dict[int, float]] = defaultdict(dict)
    seen: dict[tuple[int, str, int], int] = defaultdict(int)
    for rt in run.ranks:
        ev, names, res = rt.events, rt.names.astype(str), rt.resources.astype(str)
        for i in np.flatnonzero(res == "coll.ep"):
            key = (rt.rank, names[i], int(ev["iteration"][i]))
            calls[(names[i], int(ev["iteration"][i]), seen[key])][rt.rank] = \
                float(ev["t_end"][i] - ev["t_start"][i])
            seen[key] += 1
    hidden = {rt.rank: _hidden(rt) for rt in run.ranks}
    total: dict[int, float] = defaultdict(float)
    wait: dict[int, float] = defaultdict(float)
    for durations in calls.values():
        low = min(durations.values())
        for r, d in durations.items():
            total[r] += d
            wait[r] += d - low
    return pd.DataFrame([{"rank": rt.rank,
                          "tokens_routed": int(c[:, :, rt.rank].sum())
                          if c is not None and rt.rank < c.shape[2] else 0,
                          "all_to_all_s": total[rt.rank], "wait_s": wait[rt.rank],
                          "hidden_s": hidden[rt.rank]}
                         for rt in run.ranks])


def _hidden(rt: Any) -> float:
    """Time a rank's EP all-to-alls moved while its compute stream was busy."""
    ev, res = rt.events, rt.resources.astype(str)
    a2a, comp = res == "coll.ep", res == "compute"
    if not a2a.any():
        return 0.0
    start, end = ev["t_start"].astype(np.float64), ev["t_end"].astype(np.float64)
    both = a2a | comp
    return max(0.0, union_length(start[a2a], end[a2a]) + union_length(start[comp], end[comp])
               - union_length(start[both], end[both]))


def format_experts(run: Run) -> list[str]:
    """The tables `mpiemu analyze` prints for an MoE run (nothing otherwise)."""
    if routing_counts(run) is None:
        return []
    load, ranks = expert_load(run), rank_all_to_all(run)
    lines = ["experts (routing.npz): tokens per expert, busiest over mean (1 = balanced)",
             f"{'iter':>5}{'layer':>6}{'tokens':>9}{'max/mean':>10}{'busiest':>9}{'idlest':>8}"]
    for r in load.itertuples():
        lines.append(f"{r.iteration:>5}{r.layer:>6}{r.tokens:>9}{r.max_over_mean:>10.3f}"
                     f"{r.busiest_expert:>9}{r.idlest_expert:>8}")
    lines += ["", "expert-parallel all-to-alls per rank (wait: beyond the fastest rank's call; "
              "hidden: under the rank's compute)",
              f"{'rank':>5}{'tokens routed':>15}{'all-to-all ms':>15}{'wait ms':>10}"
              f"{'hidden ms':>11}"]
    for r in ranks.itertuples():
        lines.append(f"{r.rank:>5}{r.tokens_routed:>15}{r.all_to_all_s * 1e3:>15.4f}"
                     f"{r.wait_s * 1e3:>10.4f}{r.hidden_s * 1e3:>11.4f}")
    return lines + [""]


def experts_dict(run: Run) -> dict[str, object]:
    """The same, JSON-ready (empty for a dense run)."""
    if routing_counts(run) is None:
        return {}
    return {"expert_load": expert_load(run).to_dict("records"),
            "ranks": rank_all_to_all(run).to_dict("records")}

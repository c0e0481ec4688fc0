"""Every event of some ranks as one pandas DataFrame (below `load`, so `Run.to_pandas` and
`frames.RunFrames.events` share it): names and categories as categoricals, each rank's place
in the grid as columns, times in seconds."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .rank_trace import RankTrace

GRID = ("tp_rank", "dp_rank", "pp_rank", "cp_rank")
TEXT = ("name", "cat", "resource", "phase")
NUMS = ("t_start", "t_end", "flops", "bytes", "dram_bytes", "layer", "iteration", "peer",
        "stage")


def pandas() -> Any:
    """pandas, or one line saying how to get it."""
    try:
        import pandas as pd  # noqa: PLC0415
    except ImportError:
        raise ImportError("mpiemu's DataFrames need pandas: pip install pandas") from None
    return pd


def grid_frame(ranks: Sequence[RankTrace]) -> Any:
    """Each rank's place: rank, tp_rank, dp_rank, pp_rank (cp_rank with CP)."""
    return pandas().DataFrame([{"rank": rt.rank, **{g: int(rt.attrs[g]) for g in GRID
                                                    if g in rt.attrs}} for rt in ranks])


def events_frame(ranks: Sequence[RankTrace]) -> Any:
    """rank, grid place, name, cat, resource, phase, t_start_s, t_end_s, duration_s, flops,
    bytes, dram_bytes, layer, iteration, peer, stage."""
    pd = pandas()
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("rank", *TEXT, *NUMS)}
    for rt in ranks:
        parts["rank"].append(np.full(len(rt.events), rt.rank, np.int32))
        for k, arr in zip(TEXT, (rt.names, rt.cats, rt.resources, rt.phases)):
            parts[k].append(arr)
        for k in NUMS:
            parts[k].append(rt.events[k])

    def joined(k: str) -> np.ndarray:
        return np.concatenate(parts[k]) if parts[k] else np.zeros(0)
    df = pd.DataFrame({"rank": joined("rank").astype(np.int32)})
    for k in TEXT:
        df[k] = pd.Categorical(joined(k))
    for k in NUMS:
        df[f"{k}_s" if k.startswith("t_") else k] = joined(k)
    df["duration_s"] = df["t_end_s"] - df["t_start_s"]
    return df.merge(grid_frame(ranks), on="rank", how="left") if len(ranks) else df

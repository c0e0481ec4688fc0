"""The length a set of intervals covers: busy time with overlaps counted once."""
from __future__ import annotations

import numpy as np


def union_length(starts: np.ndarray, ends: np.ndarray) -> float:
    """Total length covered by a set of intervals (overlaps counted once). Vectorized, and
    bit for bit the sequential sweep: merged segments' lengths added left to right
    (`np.add.accumulate` is sequential), the last one as `(total + end) - start`."""
    if len(starts) == 0:
        return 0.0
    order = np.argsort(starts, kind="stable")
    s = np.asarray(starts, dtype=np.float64)[order]
    reach = np.maximum.accumulate(np.asarray(ends, dtype=np.float64)[order])
    first = np.flatnonzero(np.r_[True, s[1:] > reach[:-1]])     # each merged segment's start
    last = np.r_[first[1:] - 1, len(s) - 1]
    done = np.add.accumulate(reach[last[:-1]] - s[first[:-1]])[-1] if len(first) > 1 else 0.0
    return float((done + reach[last[-1]]) - s[first[-1]])

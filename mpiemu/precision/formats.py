"""Number formats a GPU computes in, rounded as ml_dtypes rounds them (to nearest, ties to
even): bfloat16, float16 and Transformer Engine's two FP8 formats (`common/recipe/__init__.py:
Format`; E4M3 max 448 with no infinity, E5M2 max 57344).

Values stay in float32 arrays: `round_to` gives the nearest value the format holds. FP8 casts
saturate (clip to +-max first: TE's and CUDA's `satfinite`; ml_dtypes alone would turn 470
into NaN in E4M3); bf16 and fp16 casts overflow to infinity as the hardware's do, which is
what FP16 loss scaling detects.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np


@dataclass(frozen=True)
class Format:
    """One number format: its numpy scalar type, largest finite value, mantissa bits."""

    name: str
    dtype: Any
    max: float
    mantissa_bits: int
    saturate: bool          # FP8: clip to +-max before the cast (satfinite)

    @property
    def eps(self) -> float:
        """The spacing of values just above 1 (a relative rounding step of 2 eps / 2)."""
        return 2.0 ** -self.mantissa_bits


FORMATS: dict[str, Format] = {
    "bf16": Format("bf16", ml_dtypes.bfloat16, float(ml_dtypes.finfo(ml_dtypes.bfloat16).max),
                   7, False),
    "fp16": Format("fp16", np.float16, float(np.finfo(np.float16).max), 10, False),
    "e4m3": Format("e4m3", ml_dtypes.float8_e4m3fn, 448.0, 3, True),
    "e5m2": Format("e5m2", ml_dtypes.float8_e5m2, 57344.0, 2, True),
}


def fmt(name: str) -> Format:
    """A format by name (bf16, fp16, e4m3, e5m2)."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"format {name!r}: allowed {sorted(FORMATS)}") from None


def round_to(x: np.ndarray, name: str) -> np.ndarray:
    """x (as float32, the tensor cores' accumulator) rounded to the format, as float32."""
    f = fmt(name)
    y = np.asarray(x, dtype=np.float32)
    if f.saturate:
        y = np.clip(y, -f.max, f.max)
    with np.errstate(over="ignore"):         # bf16 / fp16 overflow to inf, as on the GPU
        return y.astype(f.dtype).astype(np.float32)


def amax(x: np.ndarray) -> float:
    """The largest magnitude in x (what every FP8 recipe scales by)."""
    return float(np.max(np.abs(x))) if np.size(x) else 0.0

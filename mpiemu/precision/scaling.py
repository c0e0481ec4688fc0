"""Transformer Engine's FP8 scaling recipes (modern_training.md §7.2; TE
`pytorch/quantization.py: _default_get_amax_and_update_history, _default_sf_compute`,
`common/recipe/recipe_common.cuh: compute_scale_from_amax`, `Float8BlockScaling`):

- delayed (`DelayedScaling`): one scale per tensor, from the amaxes of earlier steps. Each
  cast records the tensor's amax into slot 0 of the history; at the update (the end of the
  forward pass) the amax is the history's max ('max') or slot 0 ('most_recent'), the scale
  `(FP8_MAX / amax) / 2**margin` (kept if amax is 0 or not finite; FLT_MAX if it overflows),
  then the history rolls by one and slot 0 is zeroed. A step casts with the scale of the
  update before it.
- current (`Float8CurrentScaling`): scale = FP8_MAX / amax of the tensor itself (amax raised
  to `epsilon`; 1 for an all-zero tensor; optionally rounded down to a power of 2).
- block (`Float8BlockScaling`, DeepSeek-V3 §3.3): a scale per tile, FP8_MAX / amax of the
  tile rounded down to a power of 2: activations and gradients in 1 x 128 tiles along the
  GEMM's reduction axis, weights in 128 x 128 blocks. Edge tiles hold what is left (TE asks
  for dimensions divisible by 128; DeepSeek pads).
Quantizing x with scale s gives q = cast(x s) in the FP8 format; x is recovered as q / s.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .formats import round_to

FLT_MAX = float(np.finfo(np.float32).max)
BLOCK = 128


def delayed_scale(a: float, fp8_max: float, margin: int, previous: float) -> float:
    """TE's `_default_sf_compute` (+ `delayed_scaling.cu`'s overflow guard), in float32."""
    if not (a > 0.0 and np.isfinite(a)):
        return previous
    sf = float(np.float32(fp8_max) / np.float32(a) / np.float32(2.0 ** margin))
    return sf if np.isfinite(sf) else FLT_MAX


def current_scale(a: float, fp8_max: float, epsilon: float = 0.0,
                  power_of_2: bool = False) -> float:
    """TE's `compute_scale_from_amax`, in float32."""
    a = max(a, epsilon)
    if a == 0.0:
        return 1.0
    sf = float(np.float32(fp8_max) / np.float32(a))
    if not np.isfinite(sf):
        sf = FLT_MAX
    return float(pow2_floor(sf)) if power_of_2 else sf


def pow2_floor(s: float | np.ndarray) -> np.ndarray:
    """The largest power of 2 <= s (TE keeps a float32 scale's exponent bits only)."""
    return np.exp2(np.floor(np.log2(s))).astype(np.float32)


@dataclass
class DelayedScaling:
    """One tensor's scale and amax history under TE's DelayedScaling."""

    fp8_max: float
    history_len: int = 1024
    margin: int = 0
    algo: str = "max"                      # or "most_recent"
    scale: float = 1.0
    history: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.history = np.zeros(self.history_len, dtype=np.float32)

    def record(self, a: float) -> None:
        """A cast of the tensor this step: its amax into slot 0."""
        self.history[0] = max(float(self.history[0]), a)

    def update(self) -> None:
        """The end of the forward pass: the next step's scale, then the roll."""
        a = float(self.history.max() if self.algo == "max" else self.history[0])
        self.scale = delayed_scale(a, self.fp8_max, self.margin, self.scale)
        self.history = np.roll(self.history, -1)
        self.history[0] = 0.0


def tile_amax(x: np.ndarray, tile: tuple[int, int]) -> np.ndarray:
    """amax of each (tile[0] x tile[1]) tile of a 2-D x: shape (ceil(R/t0), ceil(C/t1))."""
    r, c = x.shape
    t0, t1 = tile
    pad = np.zeros((-(-r // t0) * t0, -(-c // t1) * t1), dtype=np.float32)
    pad[:r, :c] = np.abs(x)
    return pad.reshape(pad.shape[0] // t0, t0, pad.shape[1] // t1, t1).max(axis=(1, 3))


def expand(s: np.ndarray, tile: tuple[int, int], shape: tuple[int, ...]) -> np.ndarray:
    """Per-tile values repeated over their tiles, cut to `shape`."""
    full = np.repeat(np.repeat(s, tile[0], axis=0), tile[1], axis=1)
    return full[:shape[0], :shape[1]]


def block_quantize(x: np.ndarray, tile: tuple[int, int], fmt_name: str, fp8_max: float
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(q, per-tile scale): each tile scaled by FP8_MAX / its amax, rounded down to a power
    of 2 (an all-zero tile keeps scale 1)."""
    a = tile_amax(x, tile).astype(np.float64)
    raw = np.minimum(fp8_max / np.where(a > 0, a, 1.0), FLT_MAX)      # FLT_MAX if it overflows
    s = np.where(a > 0, pow2_floor(raw), 1.0).astype(np.float32)
    q = round_to(np.asarray(x, np.float32) * expand(s, tile, x.shape), fmt_name)
    return q, s


def tensor_quantize(x: np.ndarray, scale: float, fmt_name: str) -> np.ndarray:
    """q = cast(x scale) in the format (per-tensor recipes)."""
    return round_to(np.asarray(x, np.float32) * np.float32(scale), fmt_name)

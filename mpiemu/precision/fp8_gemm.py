"""The linear GEMMs of a transformer layer in FP8 under a Transformer Engine recipe
(modern_training.md §7; TE `pytorch/module/linear.py`, `pytorch/fp8.py`), as one rank or the
one-process reference runs them:

- both operands quantized (E4M3; gradients E5M2 under the HYBRID format, E4M3 under block
  scaling), the FP8 products accumulated in fp32 and multiplied by the inverse scales (per K
  block of 128 under block scaling: DeepSeek-V3 §3.3.2's promotion to fp32), the output in
  the model's activation dtype (TE's high-precision output: bf16, or fp32 in an fp32 model)
  or the fp32 accumulator (a weight gradient into `main_grad`);
- an operand is an activation (`act`), a weight or a gradient (`grad`): fprop x W (act,
  weight), dgrad dy W^T (grad, weight), wgrad x^T dy (act, grad);
- the tensors a forward pass casts are the backward's: the dgrad uses the weight's FP8 copy
  and the wgrad the input's, each with the scale it was cast with in the forward pass;
- a weight is cast once per step, at its first micro-batch, and its FP8 copy reused by the
  others (Megatron's `is_first_microbatch`: TE caches the FP8 weights), from the model's
  bf16 copy of it, or under FP8 parameters (`from_master`: Megatron-Core's
  `fp8_param_gather`, TE's `quantize_master_weights`) from the fp32 master weight;
- delayed scaling: each cast records its tensor's amax; at the end of a layer's pass
  (forward: activations and weights; backward: gradients) the amaxes recorded are reduced
  (MAX) over the amax group, then every scale of the pass updates (TE's
  `reduce_and_update_fp8_tensors` at `fp8_autocast` exit; Megatron-Core's amax group is TP x
  DP x CP, `parallel_state.get_amax_reduction_group`). An update per layer is the update per
  block TE does: each tensor's history sees only its own casts in between;
- current scaling: each cast's scale from the amax of the whole tensor, reduced over the same
  group before the cast, so a sharded tensor is scaled as the unsharded one is (TE reduces
  the amax of sequence-parallel inputs only and scales a weight shard by its own amax: a
  per-shard scale would make the numbers depend on the parallel layout);
- block scaling: a scale per tile (`scaling.block_quantize`), 1 x 128 along the reduction
  axis for activations and gradients, 128 x 128 for weights; nothing is reduced (a shard
  whose widths are multiples of 128 holds whole tiles).
Hopper's fast FP8 accumulation in the forward GEMM (about 14 bits, DeepSeek-V3 §3.3.2) is not
modelled: every accumulation is fp32.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .formats import amax, fmt, round_to
from .scaling import BLOCK, DelayedScaling, block_quantize, current_scale, expand, \
    tensor_quantize

OPERANDS = ("act", "weight", "grad")
RECIPES = ("delayed", "current", "block")
AmaxReduce = Callable[[np.ndarray], np.ndarray]     # MAX over the amax group, in place


@dataclass(frozen=True)
class Fp8Recipe:
    """Which FP8 recipe and its knobs (TE's `DelayedScaling` defaults; Megatron's differ:
    history 1, 'most_recent')."""

    kind: str                             # delayed | current | block
    fp8_format: str = "hybrid"            # hybrid: E4M3 forward, E5M2 gradients; or e4m3
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"        # or most_recent
    margin: int = 0

    def fmt_of(self, operand: str) -> str:
        """The FP8 format an operand is cast to."""
        hybrid = self.fp8_format == "hybrid" and self.kind != "block"
        return "e5m2" if operand == "grad" and hybrid else "e4m3"


def numerics_label(dtype: str, recipe: str) -> str:
    """What a run's numbers are computed in: `bf16`, or `bf16 + FP8 (delayed scaling)`."""
    return dtype if recipe in ("", "off") else f"{dtype} + FP8 ({recipe} scaling)"


def _alone(x: np.ndarray) -> np.ndarray:
    return x


class Fp8Gemm:
    """C = A B of a layer's linear GEMM `key` (one tensor: every micro-batch's fprop, dgrad
    and wgrad of it) in FP8 under `recipe`, output in `out` (bf16 or fp32); `reduce_amax`
    MAX-reduces amaxes over the ranks sharing the tensors (none: one process)."""

    exact = False

    def __init__(self, recipe: Fp8Recipe, reduce_amax: AmaxReduce = _alone,
                 out: str = "bf16", from_master: bool = False) -> None:
        self.recipe, self.reduce_amax, self.out = recipe, reduce_amax, out
        self.from_master = from_master
        self.states: dict[tuple[str, str], DelayedScaling] = {}
        self.saved: dict[str, deque[float]] = {}      # each forward's input scale, in order
        self.weight_scale: dict[str, float] = {}      # this step's FP8 weight copies
        self.grad_scale: dict[str, float] = {}        # this backward pass's gradient casts
        self.touched: set[str] = set()                # keys cast in this pass

    def __call__(self, key: str, a: np.ndarray, b: np.ndarray,
                 operands: tuple[str, str] = ("act", "weight")) -> np.ndarray:
        """A GEMM whose output is a tensor of the output dtype (fprop, dgrad)."""
        return self.round(self.accumulate(key, a, b, operands))

    def accumulate(self, key: str, a: np.ndarray, b: np.ndarray,
                   operands: tuple[str, str] = ("act", "grad")) -> np.ndarray:
        """The GEMM's fp32 accumulator (a weight gradient into `main_grad`)."""
        lead = a.shape[:-1]
        a2 = self._source(a.reshape(-1, a.shape[-1]), operands[0])   # (M, K)
        b = self._source(b, operands[1])
        self.touched.add(key)
        if self.recipe.kind == "block":
            out = _block_gemm(a2, b, operands, *map(self.recipe.fmt_of, operands))
        else:
            sa = self._scale(key, operands[0], a2, operands)
            sb = self._scale(key, operands[1], b, operands)
            qa = tensor_quantize(a2, sa, self.recipe.fmt_of(operands[0]))
            qb = tensor_quantize(b, sb, self.recipe.fmt_of(operands[1]))
            out = (qa @ qb) * (np.float32(1.0 / sa) * np.float32(1.0 / sb))
        return out.reshape(*lead, b.shape[1])

    def _source(self, x: np.ndarray, operand: str) -> np.ndarray:
        """What a cast reads: a weight's copy in the model's dtype (the fp32 master itself
        under FP8 parameters or in an fp32 model); other tensors as they are."""
        if operand != "weight" or self.from_master or self.out == "fp32":
            return x
        return round_to(x, self.out)

    def round(self, x: np.ndarray) -> np.ndarray:
        """A tensor the layer keeps (in the output dtype)."""
        return x if self.out == "fp32" else round_to(x, self.out)

    # -- scales -------------------------------------------------------------------------------
    def _scale(self, key: str, operand: str, x: np.ndarray, operands: tuple[str, str]) -> float:
        """The scale `x` is cast with: a weight's this step's copy, a wgrad input's from its
        forward pass, a gradient's once per backward pass, else a fresh cast."""
        if operand == "weight":
            if key not in self.weight_scale:
                self.weight_scale[key] = self._cast_scale(key, operand, x)
            return self.weight_scale[key]
        if operand == "act" and operands[1] == "grad":          # wgrad: the saved input
            return self.saved[key][0]
        if operand == "grad":
            if key not in self.grad_scale:
                self.grad_scale[key] = self._cast_scale(key, operand, x)
            return self.grad_scale[key]
        s = self._cast_scale(key, operand, x)                   # fprop's input
        self.saved.setdefault(key, deque()).append(s)
        return s

    def _cast_scale(self, key: str, operand: str, x: np.ndarray) -> float:
        fp8_max = fmt(self.recipe.fmt_of(operand)).max
        if self.recipe.kind == "current":
            return current_scale(float(self.reduce_amax(np.array([amax(x)]))[0]), fp8_max)
        st = self._state(key, operand)
        st.record(amax(x))
        return st.scale

    def _state(self, key: str, operand: str) -> DelayedScaling:
        st = self.states.get((key, operand))
        if st is None:
            r = self.recipe
            st = self.states[(key, operand)] = DelayedScaling(
                fmt(r.fmt_of(operand)).max, r.amax_history_len, r.margin, r.amax_compute_algo)
        return st

    # -- passes and steps -----------------------------------------------------------------
    def end_pass(self, backward: bool) -> None:
        """A layer's forward or backward pass is over: the delayed recipe's amaxes of the pass
        reduced over the group and its scales updated; a backward pass's inputs released."""
        keys, self.touched = sorted(self.touched), set()
        if backward:
            for k in keys:
                if self.saved.get(k):
                    self.saved[k].popleft()
            self.grad_scale.clear()
        if self.recipe.kind != "delayed":
            return
        ops = ("grad",) if backward else ("act", "weight")
        states = [self._state(k, op) for k in keys for op in ops]
        if not states:
            return
        amaxes = self.reduce_amax(np.array([st.history[0] for st in states], np.float32))
        for st, a in zip(states, amaxes):
            st.history[0] = a
            st.update()

    def new_step(self) -> None:
        """A training step begins: its first micro-batch casts the weights again."""
        self.weight_scale.clear()


def _tile(operand: str, left: bool) -> tuple[int, int]:
    if operand == "weight":
        return (BLOCK, BLOCK)
    return (1, BLOCK) if left else (BLOCK, 1)


def _block_gemm(a: np.ndarray, b: np.ndarray, operands: tuple[str, str], fa: str,
                fb: str) -> np.ndarray:
    """Tile-scaled FP8 GEMM: each K block's FP8 products summed, then scaled into fp32."""
    ta, tb = _tile(operands[0], True), _tile(operands[1], False)
    qa, sa = block_quantize(a, ta, fa, fmt(fa).max)
    qb, sb = block_quantize(b, tb, fb, fmt(fb).max)
    m, k = a.shape
    n = b.shape[1]
    acc = np.zeros((m, n), dtype=np.float32)
    for kb in range(-(-k // BLOCK)):
        ks = slice(kb * BLOCK, (kb + 1) * BLOCK)
        inv_a = expand(1.0 / sa[:, kb:kb + 1], ta, (m, 1))          # (M, 1)
        inv_b = expand(1.0 / sb[kb:kb + 1, :], tb, (1, n))          # (1, N)
        acc += (qa[:, ks] @ qb[ks, :]) * inv_a * inv_b
    return acc

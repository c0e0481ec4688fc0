"""Adam's arithmetic and byte counts, shared by the per-tensor optimizer (`optim`) and the
distributed one (`zero`): the same operations in the same order as the one-process
reference, on whole tensors or on a DP rank's share of a bucket."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..devices.specs import dtype_bytes
from ..model.executor import Executor
from .config import CLIP_EPS, OptimizerConfig
from ..model.ops import Cost

MASTER_BYTES = 4           # fp32 master weights and optimizer states (thesis 4.2.1)
ADAM_FLOPS, LAMB1_FLOPS = 12, 12


def adam_direction(o: OptimizerConfig, t: int, m: np.ndarray, v: np.ndarray, g: np.ndarray
                   ) -> np.ndarray:
    """Adam's bias-corrected step of update t (m and v updated in place), before weight
    decay: the same arithmetic as the reference, on whole tensors or ZeRO shares."""
    m *= o.beta1
    m += (1.0 - o.beta1) * g
    v *= o.beta2
    v += (1.0 - o.beta2) * g * g
    return (m / (1.0 - o.beta1 ** t)) / (np.sqrt(v / (1.0 - o.beta2 ** t)) + o.eps)


def clip_coeff(o: OptimizerConfig, norm: float) -> float:
    """Megatron's clipping factor clip / (||g|| + 1e-6); gradients scale when it is < 1."""
    return o.clip_grad_norm / (norm + CLIP_EPS)


def main_grad_bytes(dtype: str) -> int:
    """Bytes of a `main_grad` element in Megatron-LM: bf16 forces gradient accumulation and
    all-reduce in fp32 (megatron/arguments.py at de593298, lines 161-170); fp16 and fp32
    keep the model's dtype (`--accumulate-allreduce-grads-in-fp32` off by default)."""
    return MASTER_BYTES if dtype == "bf16" else dtype_bytes(dtype)


def mixed_precision_passes(sizes: Sequence[int], e: int, dtype: str
                           ) -> tuple[list[tuple[str, float, float]], list[tuple[str, float, float]]]:
    """The memory passes Megatron-LM's mixed-precision optimizer runs around the fused Adam
    kernel, as (phase, bytes read, bytes written), over parameters (or ZeRO shares of them)
    of these sizes, e bytes each: before it, the fp32 copy of the gradients, one kernel per
    parameter (`main_param.grad = model_param.main_grad.float()` in a loop) and, with fp16
    loss scaling, their unscale and inf check (`torch._amp_foreach_non_finite_check_and_
    unscale_`, multi-tensor); after it, the fp32 master weights copied to the model's
    (`_copy_main_params_to_model_params`, multi_tensor_scale), and the gradient buffer
    zeroed for the next iteration (`zero_grad_buffer`). Megatron-LM
    megatron/optimizer/optimizer.py at de593298 (2022-05-24): step(), lines 416-463, and
    lines 608-650. Nothing when the model itself is fp32; no copy when `main_grad` is
    already fp32 (bf16: `.float()` returns the buffer itself), which is what gets zeroed."""
    if e >= MASTER_BYTES:
        return [], []
    n, main = sum(sizes), main_grad_bytes(dtype)
    before: list[tuple[str, float, float]] = [] if main == MASTER_BYTES else [
        ("main_grad", k * main, k * MASTER_BYTES) for k in sizes]
    if dtype == "fp16":
        before.append(("unscale", n * MASTER_BYTES, n * MASTER_BYTES))
    return before, [("copy_to_model", n * MASTER_BYTES, n * e), ("zero_grad", 0, n * main)]


def adam_cost(n: int) -> Cost:
    """apex FusedAdam on n fp32 values: read the weight, gradient, m and v, write three."""
    return Cost(ADAM_FLOPS * n, n * 4 * MASTER_BYTES, n * 3 * MASTER_BYTES)


def charge_passes(E: Executor, passes: list[tuple[str, float, float]]) -> None:
    """The optimizer's memory passes (`mixed_precision_passes`), one kernel each."""
    for phase, read, write in passes:
        E.kernel(f"optim.{phase}", Cost(0.0, read, write))

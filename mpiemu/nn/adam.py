"""Adam's arithmetic and byte counts, shared by the per-tensor optimizer (`optim`) and the
distributed one (`zero`): the same operations in the same order as the one-process
reference, on whole tensors or on a DP rank's share of a bucket."""
from __future__ import annotations

import numpy as np

from .config import CLIP_EPS, OptimizerConfig

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

"""What a rank's MoE layers share during a run: where token counts come from, the expert
biases of DeepSeek-V3's auxiliary-loss-free balancing, and the counts each step routed
(for the bias update and for `mpiemu analyze`)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .config import MoeConfig
from .routing_trace import RoutingLog, replayed
from .tokens import balanced, skewed


@dataclass
class MoeRun:
    """The MoE side of one rank's stage: settings, biases and this step's counts."""

    moe: MoeConfig
    source: str                      # "router", "balanced" or "skew" (`model.moe.tokens`)
    dispatcher: str                  # "alltoall" or "allgather" (`moe.dispatcher`)
    shared_overlap: bool
    skew: float
    seed: int
    global_batch: int                # sequences per step over every DP rank
    iteration: int = 0
    trace: np.ndarray | None = None  # recorded choices to replay (`routing_trace`)
    bias: dict[int, np.ndarray] = field(default_factory=dict)      # layer -> [E]
    step_counts: dict[int, np.ndarray] = field(default_factory=dict)   # kept, this rank
    log: RoutingLog = field(default_factory=RoutingLog)

    def begin_step(self, iteration: int) -> None:
        self.iteration = iteration
        self.step_counts.clear()

    def bias_of(self, layer: int) -> np.ndarray | None:
        """The layer's expert bias (zeros until the first update), if balancing uses one."""
        if not self.moe.expert_bias:
            return None
        return self.bias.setdefault(layer, np.zeros(self.moe.experts))

    def timing_counts(self, layer: int, sample0: int, rank_key: int, tokens: np.ndarray
                      ) -> np.ndarray:
        """[E] tokens per expert from this rank's tokens (global ids) when the router does
        not run."""
        n = len(tokens)
        if self.source == "trace":
            assert self.trace is not None
            return replayed(self.trace, self.iteration, layer, tokens, self.moe.experts)
        if self.source == "skew":
            return skewed(self.moe, n, self.skew,
                          (self.seed, self.iteration, layer, sample0, rank_key))
        return balanced(self.moe, n)

    def routed(self, layer: int, counts: np.ndarray, tokens: np.ndarray | None = None,
               chosen: np.ndarray | None = None) -> None:
        """This rank's kept tokens per expert of one micro-batch, summed over the step (and
        logged, with the tokens' choices when the router ran)."""
        have = self.step_counts.get(layer)
        self.step_counts[layer] = counts.copy() if have is None else have + counts
        self.log.add(self.iteration, layer, counts, tokens, chosen)

    def update_bias(self, layer: int, total: np.ndarray) -> None:
        """b_e += rate x sign(mean load - load_e) over the step's global counts (DeepSeek-V3
        2.1.2; Megatron-Core moe_utils.py `get_updated_expert_bias`)."""
        b = self.bias_of(layer)
        assert b is not None
        b += self.moe.bias_update_rate * np.sign(total.mean() - total)

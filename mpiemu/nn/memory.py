"""Per-rank memory in the emulated dtype: parameters, gradients, optimizer, activations.

Activations are counted from what the layers actually keep for backward (`layers.py`,
`attention.py`, `model.py`): a test checks these counts against the arrays a numerics run
stores. Without SP a layer keeps exactly Korthikanti et al. 2022's sbh(10 + 24/t + 5as/(ht))
bytes (Table 2, 2-byte values, no recomputation) plus the fp32 LayerNorm statistics; with SP
it keeps 4sbh(1 - 1/t) more than their sbh/t (34 + 5as/h), because the gathered inputs of the
column-parallel GEMMs are kept instead of gathered again in backward.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .config import ModelConfig
from .engine import Dims
from .ops import MASK_BYTES, STAT_BYTES
from .optim import state_bytes_per_param
from .shard import local_params

GIB = 2.0**30


@dataclass(frozen=True)
class Stored:
    """Elements kept for backward: activations (emulated dtype), fp32 statistics, masks."""

    act: int = 0
    stats: int = 0
    masks: int = 0

    def __add__(self, o: "Stored") -> "Stored":
        return Stored(self.act + o.act, self.stats + o.stats, self.masks + o.masks)

    def bytes(self, e: int) -> int:
        return self.act * e + self.stats * STAT_BYTES + self.masks * MASK_BYTES


def layer_stored(cfg: ModelConfig, d: Dims) -> Stored:
    """What one layer keeps (pre- or post-LN alike): per sub-layer LN input and statistics,
    the gathered input of the column-parallel GEMM, and the sub-layer's own tensors."""
    t, ts, h, w = d.rows, d.shard_rows, d.hidden, d.attn_width
    scores = d.batch * d.heads * d.seq * d.seq
    drop = cfg.hidden_dropout > 0
    s = Stored(act=2 * ts * h + 2 * t * h, stats=4 * ts, masks=2 * ts * h if drop else 0)
    s += Stored(act=3 * t * w + t * w)                        # q, k, v and the context
    if cfg.attention != "flash":                               # baseline, sd, sdf keep y
        pdrop = cfg.attention_dropout > 0
        s += Stored(act=scores * (2 if pdrop else 1), masks=scores if pdrop else 0)
    else:
        s += Stored(stats=d.batch * d.heads * d.seq)          # row log-sum-exp only
    return s + Stored(act=2 * t * d.ffn)                      # GeLU input and output


def edge_stored(cfg: ModelConfig, d: Dims) -> Stored:
    """Embedding (dropout mask, post-LN norm) plus final norm, LM head input and logits."""
    t, ts, h = d.rows, d.shard_rows, d.hidden
    s = Stored(act=ts * h, stats=2 * ts)                      # lne (post) or lnf (pre)
    if cfg.hidden_dropout > 0:
        s += Stored(masks=ts * h)
    return s + Stored(act=t * h + t * d.vocab, stats=t)      # head input, logits, lse


@dataclass(frozen=True)
class MemoryReport:
    """Bytes per rank against the device's capacity."""

    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    capacity_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes \
            + self.activations_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.capacity_bytes

    def line(self) -> str:
        unit, scale = ("GiB", GIB) if self.total_bytes >= GIB / 10 else ("MiB", 2.0**20)
        g = [x / scale for x in (self.params_bytes, self.grads_bytes, self.optimizer_bytes,
                                 self.activations_bytes, self.total_bytes)]
        return (f"params {g[0]:.3g} + grads {g[1]:.3g} + optimizer {g[2]:.3g} + activations "
                f"{g[3]:.3g} = {g[4]:.3g} {unit} of {self.capacity_bytes / GIB:.3g} GiB "
                f"({'fits' if self.fits else 'does NOT fit'})")


def local_param_count(cfg: ModelConfig, tp: int) -> int:
    """Elements a TP rank holds: one layer's count times the layers, plus the rest (its
    cost does not grow with the layer count)."""
    one = [lp for lp in local_params(replace(cfg, layers=1), tp)]
    per_layer = sum(lp.size for lp in one if lp.layer == 0)
    return sum(lp.size for lp in one if lp.layer != 0) + per_layer * cfg.layers


def memory_report(cfg: ModelConfig, d: Dims, e: int, capacity_bytes: float) -> MemoryReport:
    """Parameters and gradients in the emulated dtype, fp32 master + Adam/LAMB states,
    activations of one micro-batch kept for backward (no recomputation)."""
    n = local_param_count(cfg, d.tp)
    acts = cfg.layers * layer_stored(cfg, d).bytes(e) + edge_stored(cfg, d).bytes(e)
    return MemoryReport(n * e, n * e, n * state_bytes_per_param(e), acts, capacity_bytes)


# Host memory of a numerics run beyond what it stores: the process itself (Python, numpy,
# mpi4py, h5py: 63 MiB measured) and backward's transient arrays, about TRANSIENT_ROWS
# [rows, hidden] tensors plus TRANSIENT_SCORES score-sized ones (scores, probabilities and
# their gradient; none with flash attention). CALIBRATED: the two counts were fitted on
# the peak RSS of three tiny-GPT runs (tp=2, fp64: H 512 / 1024 / 2048, seq 256 / 512 / 512)
# and are judged on other shapes in tests/test_nn_memory.py::test_host_estimate_*.
PROCESS_BYTES = 63 * 2**20
TRANSIENT_ROWS = 10
TRANSIENT_SCORES = 3


def host_bytes(cfg: ModelConfig, d: Dims, itemsize: int) -> float:
    """Host memory a numerics run of this rank needs at its peak: weights, grads, m, v,
    stored activations, backward's transients and the process itself."""
    n = local_param_count(cfg, d.tp)
    stored = cfg.layers * layer_stored(cfg, d).act + edge_stored(cfg, d).act
    scores = 0 if cfg.attention == "flash" else d.batch * d.heads * d.seq * d.seq
    transient = TRANSIENT_ROWS * d.rows * d.hidden + TRANSIENT_SCORES * scores
    return (4 * n + stored + transient) * itemsize + PROCESS_BYTES

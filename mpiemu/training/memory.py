"""Per-rank memory in the emulated dtype: parameters, gradients, optimizer, activations.

Activations are counted from what the layers actually keep for backward (`layers.py`,
`attention.py`, `model.py`): a test checks these counts against the arrays a numerics run
stores. Per layer that is Korthikanti et al. 2022's Table 2 (2-byte values) plus the fp32
LayerNorm statistics: sbh(10 + 24/t + 5as/(ht)) with TP, sbh/t (34 + 5as/h) with TP + SP
(the column-parallel inputs are kept as sequence shards and gathered again in backward),
34 sbh/t with selective recomputation (no S x S tensors) and the layer input alone, 2sbh/t,
with full recomputation. A pipeline stage holds one such set per micro-batch in flight, as
many as its schedule has run forwards ahead of backwards (`model.pipeline_schedules.in_flight`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

from ..model.config import ModelConfig
from ..model.dims import Dims
from ..model.ops import MASK_BYTES, STAT_BYTES
from .optimizer import state_bytes_per_param
from ..model.pipeline_schedules import combined_steps, order
from ..model.pipeline_split import LayerSplit, chunk_layers, stage_layer_count
from ..model.stage import edge_names
from ..model.tensor_parallel import ExpertPlace, local_params

GIB = 2.0**30


@dataclass(frozen=True)
class Stored:
    """Elements kept for backward: activations (emulated dtype), fp32 statistics, masks,
    FP8 copies (one byte)."""

    act: int = 0
    stats: int = 0
    masks: int = 0
    fp8: int = 0

    def __add__(self, o: "Stored") -> "Stored":
        return Stored(self.act + o.act, self.stats + o.stats, self.masks + o.masks,
                      self.fp8 + o.fp8)

    def __mul__(self, k: int) -> "Stored":
        return Stored(self.act * k, self.stats * k, self.masks * k, self.fp8 * k)

    def bytes(self, e: int) -> int:
        return self.act * e + self.stats * STAT_BYTES + self.masks * MASK_BYTES + self.fp8


def norm_stats(cfg: ModelConfig) -> int:
    """fp32 statistics a norm keeps per row: LayerNorm's mean and rstd, RMSNorm's rstd."""
    return 2 if cfg.norm_kind == "layernorm" else 1


def layer_stored(cfg: ModelConfig, d: Dims, recompute: str = "none", moe: bool = False,
                 etp: int = 1) -> Stored:
    """What one layer keeps (pre- or post-norm alike): per sub-layer the norm's input and
    statistics, the input of the column-parallel GEMM (a sequence shard under SP), and the
    sub-layer's own tensors (q, the KV heads once each, the context, heads x head_dim wide
    (`kv_channels`); QK-norm's inputs q and k and one fp32 rstd per head and row; the MLP
    activation's input and output, or the experts': `moe`); under `full` recomputation only
    the layer's input."""
    t, ts, h, w = d.rows, d.shard_rows, d.hidden, d.attn_width
    if recompute == "full":
        return Stored(act=ts * h)
    scores = d.batch * d.heads * d.seq * d.seq
    drop = cfg.hidden_dropout > 0
    s = Stored(act=4 * ts * h, stats=2 * norm_stats(cfg) * ts, masks=2 * ts * h if drop else 0)
    if cfg.mla:
        s += latent_stored(cfg, d)
    else:
        s += Stored(act=2 * t * w + 2 * t * d.kv_heads * d.head_dim)   # q, k, v, the context
    if cfg.qk_norm:                             # the norms' inputs and rstd (`qk_norm`)
        s += Stored(act=t * (w + d.kv_heads * d.head_dim), stats=t * (d.heads + d.kv_heads))
    if cfg.attention == "flash":
        s += Stored(stats=d.batch * d.heads * d.seq)          # row log-sum-exp only
    elif recompute == "none":                                  # baseline, sd, sdf keep y
        pdrop = cfg.attention_dropout > 0
        s += Stored(act=scores * (2 if pdrop else 1), masks=scores if pdrop else 0)
    gated = 3 if cfg.gated else 2              # SwiGLU's [gate | up] input; GeLU's input
    if cfg.moe is not None and moe:
        return s + moe_stored(cfg, d, etp)
    return s + Stored(act=gated * t * d.ffn)   # and the activation's output


def fp8_inputs(cfg: ModelConfig, d: Dims, s: Stored) -> Stored:
    """A dense layer's `s` under an FP8 recipe: Transformer Engine saves the FP8 copy of a
    linear layer's input for its weight gradient, not the bf16 tensor (`module/linear.py`,
    `layernorm_linear.py`): the QKV and FC-1 inputs (sequence shards under SP) and FC-2's
    (the activation's output) are kept in one byte; the attention's output is kept as it is
    for the attention backward, and its FP8 copy for the projection's added."""
    ts, t = d.shard_rows, d.rows
    moved = 2 * ts * d.hidden + t * d.ffn
    return s + Stored(act=-moved, fp8=moved + t * d.attn_width)


def latent_stored(cfg: ModelConfig, d: Dims) -> Stored:
    """MLA's tensors (`model.latent_attention`): the normed query and KV latents and their
    norms' inputs and rstd (the rank's rows), q and k of head_dim + rotated dims, v and the
    context of v_head_dim, per head of the rank."""
    t, ts, ql = d.rows, d.shard_rows, cfg.q_lora_rank
    heads = t * d.heads * (2 * cfg.qk_head_dim + 2 * cfg.v_dim)
    return Stored(act=heads + 2 * ts * (ql + cfg.kv_lora_rank), stats=ts * (2 if ql else 1))


def moe_stored(cfg: ModelConfig, d: Dims, etp: int = 1) -> Stored:
    """An MoE layer's MLP side under perfect balance (each rank receives as many token
    copies as it routes, ts x k): the router's scores, the copies' expert inputs as gathered
    over expert TP (etp x theirs), their [gate | up] and activation (the rank's 1 / etp of
    the FFN), the combined output, and the shared experts' [gate | up] and activation."""
    assert cfg.moe is not None
    m, ts = cfg.moe, d.shard_rows
    copies = ts * m.top_k
    shared = 3 * d.rows * (m.shared_ffn // d.tp)
    routed = copies * ((1 + etp) * d.hidden + 3 * m.expert_ffn)
    return Stored(act=ts * m.experts + routed + shared)


def embed_stored(cfg: ModelConfig, d: Dims) -> Stored:
    """What the first virtual stage keeps per micro-batch (post-LN norm; dropout mask)."""
    ts, h = d.shard_rows, d.hidden
    s = Stored(act=ts * h, stats=norm_stats(cfg) * ts) if cfg.norm == "post" else Stored()
    return s + (Stored(masks=ts * h) if cfg.hidden_dropout > 0 else Stored())


def head_stored(cfg: ModelConfig, d: Dims) -> Stored:
    """What the last virtual stage keeps per micro-batch: final norm (pre-LN), the head's
    input (a sequence shard under SP), logits and their log-sum-exp."""
    t, ts, h = d.rows, d.shard_rows, d.hidden
    s = Stored(act=ts * h, stats=norm_stats(cfg) * ts) if cfg.norm == "pre" else Stored()
    return s + Stored(act=ts * h + t * d.vocab, stats=t)


def edge_stored(cfg: ModelConfig, d: Dims) -> Stored:
    """Embedding plus LM head: what a one-stage model keeps beside its layers."""
    return embed_stored(cfg, d) + head_stored(cfg, d)


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


class Layout(NamedTuple):
    """Where a rank sits in the pipeline and how its step runs: what its memory depends on
    beyond the shapes."""

    pp: int = 1
    stage: int = 0
    chunks: int = 1
    schedule: str = "1f1b"
    micro_batches: int = 1
    recompute: str = "none"
    dp: int = 1                     # the ranks ZeRO shards over (DP x CP)
    zero: int = 0                   # ZeRO stage (training.config.OptimizerConfig.zero)
    grad_bytes: int = 0             # a gradient element (Megatron's buffer); 0: the dtype's
    prefetch: bool = True           # ZeRO-3: the next layer gathered under this one
    reshard_after_forward: bool = True   # ZeRO-3: a layer's parameters freed after forward
    split: LayerSplit = LayerSplit()     # which layers each stage holds
    ep: int = 1                     # expert parallelism: experts split over ep ranks
    etp: int = 1                    # expert tensor parallelism: each expert over etp ranks
    # an [fp8] recipe: Transformer Engine's FP8 copies of each layer weight (rowwise for the
    # forward, columnwise for the backward), bytes per parameter; 0 without FP8
    fp8_copies: int = 0
    # FP8 parameters (optimizer.fp8_param_gather): the layers' weights held in FP8, the
    # rowwise copy being the parameter itself (1 byte, not the emulated dtype's)
    fp8_params: bool = False
    # the combined 1F1B schedule (moe.overlap_ep_comm): one more micro-batch in flight
    combined: bool = False

    def layers(self, cfg: ModelConfig, chunk: int | None = None) -> int:
        """Layers of this stage (of one of its chunks)."""
        if chunk is None:
            return stage_layer_count(cfg.layers, self.pp, self.chunks, self.stage, self.split)
        return len(chunk_layers(cfg.layers, self.pp, self.chunks, self.stage, chunk,
                                self.split))

    def moe_layers(self, cfg: ModelConfig, chunk: int | None = None) -> int:
        """Of those, the layers with experts (none in a dense model)."""
        if cfg.moe is None:
            return 0
        chunks = range(self.chunks) if chunk is None else [chunk]
        return sum(cfg.moe.is_moe(i) for c in chunks
                   for i in chunk_layers(cfg.layers, self.pp, self.chunks, self.stage, c,
                                         self.split))


def layer_param_count(cfg: ModelConfig, tp: int, ep: int = 1, moe: bool = False,
                      etp: int = 1) -> int:
    """Elements of one transformer layer on a TP rank (an MoE layer's: this EP rank's
    experts, their expert-TP slices)."""
    one = replace(cfg, layers=1, moe=None if cfg.moe is None else
                  replace(cfg.moe, dense_layers=0 if moe else 1))
    return sum(lp.size for lp in local_params(one, tp, ExpertPlace(ep, 0, etp))
               if lp.layer == 0)


def expert_param_count(cfg: ModelConfig, tp: int, ep: int, etp: int = 1) -> int:
    """Elements of one MoE layer's routed experts on an EP rank (their expert-TP slices)."""
    one = replace(cfg, layers=1, moe=None if cfg.moe is None else
                  replace(cfg.moe, dense_layers=0))
    return sum(lp.size for lp in local_params(one, tp, ExpertPlace(ep, 0, etp))
               if lp.layer == 0 and lp.expert)


def local_param_count(cfg: ModelConfig, tp: int, lay: Layout = Layout()) -> int:
    """Elements a rank of stage `lay.stage` holds: its dense and MoE layers' counts, plus
    its embedding / head tensors (the cost grows with neither the layers nor the stages)."""
    edge = edge_names(cfg, lay.pp, lay.stage)
    edges = sum(lp.size for lp in local_params(replace(cfg, layers=1, moe=None), tp)
                if lp.layer == -1 and lp.name in edge)
    moe = lay.moe_layers(cfg)
    dense = layer_param_count(cfg, tp) * (lay.layers(cfg) - moe)
    return edges + dense + (layer_param_count(cfg, tp, lay.ep, True, lay.etp) * moe
                            if moe else 0)


def stage_activations(cfg: ModelConfig, d: Dims, e: int, lay: Layout = Layout()) -> Stored:
    """What the stage keeps at its peak: every chunk's micro-batches in flight under the
    schedule (1F1B stage i: p - i; GPipe: all m), each with its layers (and embedding or
    head on the first or last virtual stage)."""
    per_layer = layer_stored(cfg, d, lay.recompute)
    if lay.fp8_copies and lay.recompute != "full":
        per_layer = fp8_inputs(cfg, d, per_layer)
    per_moe = layer_stored(cfg, d, lay.recompute, moe=True, etp=lay.etp)
    chunk = []
    for c in range(lay.chunks):
        k = lay.moe_layers(cfg, c)
        s = per_layer * (lay.layers(cfg, c) - k) + per_moe * k
        if c == 0 and lay.stage == 0:
            s += embed_stored(cfg, d)
        if c == lay.chunks - 1 and lay.stage == lay.pp - 1:
            s += head_stored(cfg, d)
        chunk.append(s)
    # plain ints in the loop (a 512-micro-batch schedule of 64 stages is 65k steps)
    sizes = [(x.act, x.stats, x.masks, x.fp8, x.bytes(e)) for x in chunk]
    act = stats = masks = fp8 = live = 0
    peak, peak_bytes = Stored(), 0
    sched = (lay.schedule, lay.pp, lay.stage, lay.micro_batches, lay.chunks)
    passes = [ps for step in combined_steps(*sched) for ps in step] if lay.combined else \
        order(*sched)
    for ps in passes:
        da, ds, dm, df, db = sizes[ps.chunk]
        sign = 1 if ps.kind == "F" else -1
        act, stats, masks = act + sign * da, stats + sign * ds, masks + sign * dm
        fp8, live = fp8 + sign * df, live + sign * db
        if live > peak_bytes:
            peak, peak_bytes = Stored(act, stats, masks, fp8), live
    return peak


def memory_report(cfg: ModelConfig, d: Dims, e: int, capacity_bytes: float,
                  lay: Layout = Layout()) -> MemoryReport:
    """Parameters and gradients in the emulated dtype (plus FP8 copies of the layers'
    weights under an FP8 recipe), fp32 master + Adam/LAMB states, activations at the
    stage's peak (saved in the emulated dtype; under an FP8 recipe a dense layer's linear
    inputs as FP8 copies, `fp8_inputs`). ZeRO (Rajbhandari et al. 2020, 5, Fig. 1: (2 + 2 + K)
    Psi / N_d at stage 3) shards over DP the states (stage 1), the gradients (2: plus the
    unit being reduce-scattered, whole) and the parameters (3: plus the layers gathered at
    once: the one computing and, prefetched, the next; every layer when none is resharded
    after forward; the embedding and head unit stays gathered). Routed experts shard over
    expert data parallelism instead (the stage's ranks over EP x ETP: `edp`)."""
    n = local_param_count(cfg, d.tp, lay)
    g = lay.grad_bytes or e
    moe = lay.moe_layers(cfg)
    xu = expert_param_count(cfg, d.tp, lay.ep, lay.etp) if moe else 0   # one layer's experts
    ud = layer_param_count(cfg, d.tp, lay.ep, moe > 0, lay.etp) - xu    # the rest of a layer
    x, edp = xu * moe, max(1, lay.dp * d.tp // (lay.ep * lay.etp))
    grads = float(n * g)
    if lay.zero >= 2:
        grads = (n - x - ud) * g / lay.dp + ud * g + (x - xu) * g / edp + xu * g
    layers = lay.layers(cfg)
    edge, le = n - x - ud * layers, (1 if lay.fp8_params else e)   # the layers' weights: le
    live = layers
    if lay.zero == 3:
        live = min((2 if lay.prefetch else 1) if lay.reshard_after_forward else layers, layers)
    live_moe = min(live, moe)
    params = ud * (layers - live) * le / lay.dp + ud * live * le + edge * e \
        + xu * (moe - live_moe) * le / edp + xu * live_moe * le
    # TE's FP8 copies of the layers' weights held whole (FP8 parameters are the rowwise one)
    params += (ud * live + xu * live_moe) * (lay.fp8_copies - (1 if lay.fp8_params else 0))
    sb, z = state_bytes_per_param(e), lay.zero >= 1
    states = (n - x) * sb / (lay.dp if z else 1) + x * sb / (edp if z else 1)
    acts = stage_activations(cfg, d, e, lay).bytes(e)
    return MemoryReport(params, grads, states, acts, capacity_bytes)


# Host memory of a numerics run beyond what it stores: the process itself (Python, numpy,
# mpi4py, h5py: 63 MiB measured) and backward's transient arrays, about TRANSIENT_ROWS
# [rows, hidden] tensors plus TRANSIENT_SCORES score-sized ones (scores, probabilities and
# their gradient; none with flash attention). CALIBRATED: the two counts were fitted on
# the peak RSS of three tiny-GPT runs (tp=2, fp64: H 512 / 1024 / 2048, seq 256 / 512 / 512)
# and are judged on other shapes in tests/test_memory.py::test_host_estimate_*.
PROCESS_BYTES = 63 * 2**20
TRANSIENT_ROWS = 10
TRANSIENT_SCORES = 3


def host_bytes(cfg: ModelConfig, d: Dims, itemsize: int, lay: Layout = Layout()) -> float:
    """Host memory a numerics run of this rank needs at its peak: weights, grads, m, v,
    stored activations, backward's transients and the process itself."""
    n = local_param_count(cfg, d.tp, lay)
    stored = stage_activations(cfg, d, itemsize, lay).act
    scores = 0 if cfg.attention == "flash" else d.batch * d.heads * d.seq * d.seq
    transient = TRANSIENT_ROWS * d.rows * d.hidden + TRANSIENT_SCORES * scores
    return (4 * n + stored + transient) * itemsize + PROCESS_BYTES

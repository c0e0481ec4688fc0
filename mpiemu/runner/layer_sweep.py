"""Workload kind "layer_sweep": one transformer layer per (H, SL, B, compute scale) point,
timing only, on real MPI ranks (thesis ch. 5's computation-vs-communication sweep).

Each point builds the layer's TP shard (Megatron slicing, `model/layers.py`), starts every
rank at the same emulated time, runs forward and backward (TP all-reduces `sequential`,
rings bidirectional under `overlap.bidirectional`) on the device's cost scaled by the
point's `compute_scale` (`device.scale.compute`: matrix, vector, SFU peaks, clock, L2
feed; DRAM and links unchanged, thesis 5.3.3.6), then all-reduces over DP, each call
measured apart: the layer's gradients in one bucket (the DP step of 5.3.3.7's case study)
and the FC weight's gradient alone (the thesis's region of interest, 5.3.2.2 step 2.a;
4H x H / TP elements, Eq. 5.8). Events carry the point's index as their iteration. At the
end rank 0 reads its trace back and writes `layer_sweep.csv`: per point the serialized TP
communication (`analysis.breakdown`: TP collectives not under compute) over the layer's
time, the attention core's share of compute (the SL^2 terms: score and context BGEMMs,
scale / mask / softmax / dropout, forward and backward), and the FC gradient all-reduce
over the FC's weight-gradient and error GEMMs that hide it (Eq. 5.7), and the layer's
DP all-reduce.
"""
from __future__ import annotations

import csv
import re
from dataclasses import replace
from typing import Any

from mpi4py import MPI

from ..comm.collectives import all_reduce
from ..devices.caps import scaled
from ..devices.cost import DeviceCost, device_cost
from ..executors.gpu import GpuExecutor
from ..executors.registry import ExecutorSetup
from ..model.config import ModelConfig
from ..model.dims import Dims
from ..model.layers import Layer
from ..model.masks import Masks
from ..model.presets import load_model_preset
from ..model.tensor_parallel import local_params
from ..config.workload import Workload
from .context import RankContext
from ..config.errors import ConfigError

GEMM = re.compile(r"(\.gemm|\.wgrad|attn\.(score|context)|attn\.bwd\.(dq|dk|dv|dprobs))$")
# the attention core: the ops whose cost grows with SL^2 (thesis Eq. 5.2, 4.3)
# (every attention op but the residual path's bias-dropout-add)
ATTN_CORE = re.compile(r"^l\d+\.attn\.(?!bias_dropout_add|residual)")
# the region of interest of the DP study (thesis 5.2.4): the FC weight's gradient
# all-reduce and the FC's weight-gradient and error GEMMs that hide it (Eq. 5.7, 5.8)
FC_BWD = re.compile(r"^l\d+\.fc1\.(bwd\.gemm|wgrad)$")
ROI = "dp.fc1.weight"
LAYER_DP = "dp.layer"
FIELDS = ("point", "hidden", "seq_len", "batch", "tp", "dp", "compute_scale", "time_s",
          "compute_s", "gemm_s", "attn_core_s", "tp_comm_s", "tp_share", "bwd_gemm_s",
          "dp_comm_s", "dp_over_bwd", "dp_layer_s")


def validate(w: Workload, world_size: int) -> None:
    if w.run.numerics != "off":
        raise ConfigError("run.numerics", w.run.numerics, "layer_sweep is timing only: 'off'")
    if w.parallel.sequence_parallel:
        raise ConfigError("parallel.sequence_parallel", True, "layer_sweep runs Megatron "
                          "TP with all-reduces (thesis ch. 5); set it to false")
    w.layer_sweep.check_tp(w.parallel.tp)


def points(w: Workload) -> list[tuple[int, int, int, float]]:
    s = w.layer_sweep
    return [(h, sl, b, c) for c in s.compute_scale for h in s.hidden for sl in s.seq_len
            for b in s.batch]


def _config(w: Workload, h: int, sl: int) -> ModelConfig:
    s = w.layer_sweep
    base = load_model_preset("tiny").config
    return replace(base, hidden=h, heads=h // s.head_dim, ffn_hidden=s.ffn_factor * h,
                   layers=1, seq_len=sl, vocab=w.parallel.tp).for_tp(w.parallel.tp)


def _point(ctx: RankContext, index: int, h: int, sl: int, b: int, cost: DeviceCost) -> None:
    """One layer forward + backward, then over DP, each measured apart: its gradients' all-reduce
    (one bucket) and the FC weight's alone (the thesis's region of interest); all ranks start
    the point at one time."""
    w, grid = ctx.w, ctx.grid
    cfg = _config(w, h, sl)
    tp = grid.tp
    dims = Dims(seq=sl, batch=b, hidden=h, heads=cfg.heads // tp, head_dim=cfg.head_dim,
                ffn=cfg.ffn_hidden // tp, vocab=cfg.padded_vocab // tp, tp=tp, sp=False)
    # every op of the point on the point's device; thesis Eq. 5.5: TP serialized
    ex = GpuExecutor(ExecutorSetup(ctx.tl, cost, ctx.tp, dims, w.run.emulated_dtype, False,
                                   w.overlap.to_overlap(strategy="sequential"),
                                   kernels=w.train.kernel_options(), tp_async=False))
    specs = [lp for lp in local_params(cfg, tp) if lp.layer == 0]
    P: dict[str, Any] = {lp.name: None for lp in specs}
    G: dict[str, Any] = dict(P)
    layer = Layer(ex, cfg, dims, 0)
    masks = Masks(cfg, w.run.seed, index, dims, grid.dp_rank * dims.batch, grid.tp_rank, False)
    ex.wait_until(ctx.world.allreduce(ctx.tl.now(), op=MPI.MAX))     # every rank together
    with ctx.tl.labelled(iteration=index, layer=0):
        with ctx.tl.labelled(phase="fwd"):
            x, cache = layer.forward(None, P, masks)
        with ctx.tl.labelled(phase="bwd"):
            layer.backward(None, cache, P, G, masks, lambda n: None)
            # the layer's DP step (thesis 5.3.3.7's overlapped communication), then the
            # region of interest alone on the DP ring (5.3.2.2 step 2.a): the FC weight's
            # gradient, H x 4H / TP elements (Eq. 5.8)
            for label, count in ((LAYER_DP, sum(lp.size for lp in specs)), (ROI, h * dims.ffn)):
                _, span = all_reduce(ctx.dp, None, reduce_s=cost.reduction_s, after=ex.t,
                                     count=count, wire_itemsize=ex.e,
                                     bidirectional=ex.overlap.bidirectional, label=label)
                ex.wait_until(span.t_end)


def run(ctx: RankContext) -> dict[str, Any]:
    pts = points(ctx.w)
    costs = {c: device_cost(scaled(ctx.spec, compute=c)[0]) for c in {p[3] for p in pts}}
    for i, (h, sl, b, c) in enumerate(pts):
        ctx.maybe_fail(i)
        _point(ctx, i, h, sl, b, costs[c])      # one cost per scale: GEMM costs cached
        ctx.end_iteration()
    ctx.writer.flush()
    ctx.world.Barrier()
    rows = _rows(ctx, pts) if ctx.rank == 0 else []
    rows = ctx.world.bcast(rows, root=0)
    ctx.say(f"layer_sweep: {len(rows)} points on tp={ctx.grid.tp} x dp={ctx.grid.dp} "
            f"({ctx.spec.name}); wrote {ctx.out / 'layer_sweep.csv'}")
    return {"points": len(rows)}


def _rows(ctx: RankContext, pts: list[tuple[int, int, int, float]]) -> list[dict[str, Any]]:
    """Rank 0: each point's shares, read back from its own trace."""
    from ..analysis.breakdown import iteration_breakdown  # noqa: PLC0415
    from ..analysis.load import read_rank  # noqa: PLC0415
    from ..sim.trace import rank_file  # noqa: PLC0415
    rt = read_rank(rank_file(ctx.out, 0))
    ev = rt.events
    dur = ev["t_end"] - ev["t_start"]
    gemm = rt.is_cat("compute") & [bool(GEMM.search(str(n))) for n in rt.names]
    attn = rt.is_cat("compute") & [bool(ATTN_CORE.search(str(n))) for n in rt.names]
    fc_bwd = rt.is_cat("compute") & [bool(FC_BWD.match(str(n))) for n in rt.names]
    roi, layer_dp = rt.names == ROI, rt.names == LAYER_DP
    rows = []
    for i, (h, sl, b, c) in enumerate(pts):
        br = iteration_breakdown(rt, i)
        mine = ev["iteration"] == i
        bwd_gemm = float(dur[mine & fc_bwd].sum())
        dp_comm = float(dur[mine & roi].max(initial=0.0))
        serial = br.compute_s + br.tp_exposed_s
        rows.append({"point": i, "hidden": h, "seq_len": sl, "batch": b, "tp": ctx.grid.tp,
                     "dp": ctx.grid.dp, "compute_scale": c, "time_s": br.iteration_s,
                     "compute_s": br.compute_s, "gemm_s": float(dur[mine & gemm].sum()),
                     "attn_core_s": float(dur[mine & attn].sum()),
                     "tp_comm_s": br.tp_exposed_s, "tp_share": br.tp_exposed_s / serial,
                     "bwd_gemm_s": bwd_gemm, "dp_comm_s": dp_comm,
                     "dp_over_bwd": dp_comm / bwd_gemm,
                     "dp_layer_s": float(dur[mine & layer_dp].max(initial=0.0))})
    with (ctx.out / "layer_sweep.csv").open("w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=FIELDS)
        wr.writeheader()
        for r in rows:
            wr.writerow({k: repr(v) if isinstance(v, float) else v for k, v in r.items()})
    return rows

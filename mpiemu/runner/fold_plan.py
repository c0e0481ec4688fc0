"""`run.fold`: whether a job runs one MPI rank per emulated GPU or one per pipeline stage.

A job launched with tp x dp x pp ranks runs every emulated rank. A job launched with pp
ranks, `run.fold = "auto"` or `"on"`, runs one rank per stage standing for its tp x dp
symmetric images (`comm.mirror`), when that is exact:

* timing only (`run.numerics = "off"`): real values differ between replicas;
* a `train` or `layer_sweep` run, every rank on the same device, no injected fault on one
  rank;
* the network looks the same from every image: each route inside a TP group, inside a DP
  group and between stages keeps its transport, node crossing and hop count when every
  device is shifted by the same (tp, dp) offset (`Fold.image`). A TP group split across
  nodes, or several DP replicas sharing a node unevenly, fail this check.

Cases only the run itself meets (a collective over a length its group does not divide,
NCCL's tree chosen across nodes) raise `FoldError` on the first such call, naming it.
"""
from __future__ import annotations

from typing import Callable

from ..comm.tuner import allowed_on
from ..comm.shape import Fold
from ..comm.shape import GridShape
from ..net import Network
from ..config.workload import Workload, resolve_device, resolve_network
from ..config.errors import ConfigError

# kinds whose ranks differ only by their place in the grid (layer_sweep: thesis ch. 5 to TP 256)
FOLDABLE_KINDS = ("train", "layer_sweep")


def obstacle(w: Workload, stages: list[int] | None = None) -> str | None:
    """Why folding this workload would not be exact (None: it is); `stages`: check the
    network's symmetry around these stages only (default: all)."""
    if w.run.kind not in FOLDABLE_KINDS:
        return f"run.kind = {w.run.kind!r} (folding covers {' and '.join(FOLDABLE_KINDS)} runs)"
    if w.run.numerics != "off":
        return "run.numerics = \"on\" (replicas hold different values; folding mirrors timing only)"
    if w.device.rank_presets:
        return "device.rank_presets gives ranks different devices"
    if w.debug.fail_rank != -1:
        return "debug.fail_rank injects a fault on one rank"
    if w.parallel.cp > 1:
        return "parallel.cp > 1 (context-parallel ranks attend to different sequence chunks)"
    shape = GridShape(w.parallel.tp, w.parallel.dp, w.parallel.pp)
    net = w.network_of(shape.size)
    if net.spec.fabric == "ring" and shape.size > shape.tp:
        return ("a ring fabric with DP or PP groups (their messages cross other devices' "
                "links, which traces name only by the first)")
    dp_group = [shape.rank_of(0, d, 0) for d in range(shape.dp)]
    if shape.dp > 1 and not w.optimizer.distributed and w.collectives.algorithm != "ring" \
            and "tree" in allowed_on(net, dp_group, "all_reduce"):
        return ("the DP group spans nodes, where NCCL may run its all-reduce as a tree (whose "
                "ranks differ): set optimizer.distributed = true (reduce-scatter and "
                "all-gather rings) or collectives.algorithm = \"ring\"")
    return _network_obstacle(net, Fold(shape), stages)


def _signature(net: Network, a: int, b: int) -> tuple[object, ...]:
    h = net.hop(a, b)
    return (h.transport, h.inter_node, h.hops, h.ingress is None)


def _network_obstacle(net: Network, fold: Fold, stages: list[int] | None) -> str | None:
    """The first route that changes under a symmetry of a stage (None: none does)."""
    s = fold.shape
    images = fold.images()[1:]
    for p in range(s.pp) if stages is None else stages:
        rep = s.rank_of(0, 0, p)
        groups = [[s.rank_of(t, 0, p) for t in range(s.tp)],
                  [s.rank_of(0, d, p) for d in range(s.dp)]]
        pairs = [(a, b) for g in groups for a in g for b in g if a != b]
        pairs += [(x, y) for k in range(s.pp) if k != p
                  for x, y in ((rep, s.rank_of(0, 0, k)), (s.rank_of(0, 0, k), rep))]
        bad = _broken(net, images, pairs)
        if bad is not None:
            (a, b), (ga, gb) = bad
            return (f"the network is not the same from every rank of stage {p}: the route "
                    f"{a}->{b} and its image {ga}->{gb} differ (hierarchical nodes that cut "
                    "a TP or DP group unevenly)")
    return None


def _broken(net: Network, images: list[Callable[[int], int]], pairs: list[tuple[int, int]]
            ) -> tuple[tuple[int, int], tuple[int, int]] | None:
    for a, b in pairs:
        sig = _signature(net, a, b)
        for g in images:
            if _signature(net, g(a), g(b)) != sig:
                return (a, b), (g(a), g(b))
    return None


def plan_fold(w: Workload, world_size: int, stages: list[int] | None = None) -> Fold | None:
    """The job's fold (None: every emulated rank is an MPI rank); a launch that fits
    neither, or a fold that would not be exact, is refused in one line (`stages`: the
    stages whose symmetry to check; default all)."""
    resolve_network(w, resolve_device(w, 0))        # a bad value there is named first
    tp, dp, pp = w.parallel.tp, w.parallel.dp, w.parallel.pp
    full, mode = w.parallel.devices, w.run.fold
    if world_size == full and (mode != "on" or full == pp):
        return None
    if mode == "on" and world_size != pp:
        raise ConfigError("run.fold", mode, f"a job of parallel.pp = {pp} ranks (one per "
                          f"pipeline stage); this one has {world_size}")
    if mode == "off" or world_size != pp:
        hint = "" if mode == "off" or full == pp else (
            f", or {pp} (one per pipeline stage) with run.fold = \"auto\" in timing-only runs")
        raise ConfigError(w.parallel.grid_field, w.parallel.grid_value,
                          f"must equal the {world_size} ranks of this job{hint}")
    why = obstacle(w, stages)
    if why is not None:
        raise ConfigError("run.fold", mode, f"exact folding only; here {why}: launch "
                          f"{full} ranks to run every emulated GPU")
    return Fold(GridShape(tp, dp, pp))

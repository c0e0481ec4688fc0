"""`run.fold`: whether a job runs one MPI rank per emulated GPU or one per (CP rank, stage).

A job launched with tp x cp x dp x pp ranks runs every emulated rank. A job launched with
cp x pp ranks, `run.fold = "auto"` or `"on"`, runs one rank per context-parallel rank of each
pipeline stage, standing for its tp x dp symmetric images (`comm.mirror`), when that is
exact:

* timing only (`run.numerics = "off"`): real values differ between replicas;
* a `train` or `layer_sweep` run, every rank on the same device, no injected fault on one
  rank;
* the network looks the same from every image: each route inside a TP group, inside a DP
  group, from a representative to its CP and DP x CP groups and between stages keeps its
  transport, node crossing and hop count when every device is shifted by the same (tp, dp)
  offset (`Fold.image`). A TP group split across nodes, or several DP replicas sharing a
  node unevenly, fail this check.

Cases only the run itself meets (a collective over a length its group does not divide,
NCCL's tree chosen across nodes, a DP x CP message to a member other than a ring neighbour)
raise `FoldError` on the first such call, naming it.
"""
from __future__ import annotations

from typing import Callable

from ..comm.ring import orders_of
from ..comm.tuner import allowed_on
from ..comm.shape import Fold
from ..comm.shape import GridShape
from ..net import Network
from ..config.workload import Workload, resolve_device, resolve_network
from ..config.errors import ConfigError
from .moe_setup import model_of

# kinds whose ranks differ only by their place in the grid (layer_sweep: thesis ch. 5 to TP 256)
FOLDABLE_KINDS = ("train", "layer_sweep")


def obstacle(w: Workload, ranks: list[int] | None = None) -> str | None:
    """Why folding this workload would not be exact (None: it is); `ranks`: check the
    network's symmetry around these MPI ranks' representatives only (default: all)."""
    if w.run.kind not in FOLDABLE_KINDS:
        return f"run.kind = {w.run.kind!r} (folding covers {' and '.join(FOLDABLE_KINDS)} runs)"
    if w.run.numerics != "off":
        return "run.numerics = \"on\" (replicas hold different values; folding mirrors timing only)"
    if w.device.rank_presets:
        return "device.rank_presets gives ranks different devices"
    if 0 < w.optimizer.shard_group < w.parallel.dp * w.parallel.cp:
        return ("optimizer.shard_group cuts DP into blocks (hybrid sharding), whose members "
                "are not shifts of one another")
    if w.debug.fail_rank != -1:
        return "debug.fail_rank injects a fault on one rank"
    why = _experts_obstacle(w)
    if why is not None:
        return why
    shape = GridShape(w.parallel.tp, w.parallel.dp, w.parallel.pp, w.parallel.cp,
                      w.parallel.ep)
    net = w.network_of(shape.size)
    if net.spec.fabric == "ring" and shape.size > shape.tp:
        return ("a ring fabric with CP, DP or PP groups (their messages cross other devices' "
                "links, which traces name only by the first)")
    dp_group = _dp_group(shape, 0)
    if shape.dp > 1 and not w.optimizer.distributed and w.collectives.algorithm != "ring" \
            and "tree" in allowed_on(net, dp_group, "all_reduce"):
        group = "DP x CP" if shape.cp > 1 else "DP"
        return (f"the {group} group spans nodes, where NCCL may run its all-reduce as a tree "
                "(whose ranks differ): set optimizer.zero = 1 (reduce-scatter and all-gather "
                "rings) or collectives.algorithm = \"ring\"")
    why = _network_obstacle(net, Fold(shape), ranks)
    if why is None and shape.cp > 1 and shape.dp > 1 and _far_neighbours(net, dp_group):
        why = ("the DP x CP group's rings (one per rail across nodes) pair members more than "
               "one apart, which its folded form (CP ranks real, DP replicas mirrored) cannot "
               "pair")
    return why


def _experts_obstacle(w: Workload) -> str | None:
    """Experts fold under perfect balance, where their groups are shifts of one another:
    EP = TP, or TP = 1 and EP = DP, without CP; without EP unless the whole stage (TP and
    DP) shares the experts."""
    if model_of(w).moe is None:
        return None
    src, par = w.moe.source(False), w.parallel
    if src != "balanced":
        return (f"moe.tokens = {src!r} sends different tokens from each rank (only perfect "
                "balance, 'balanced', folds)")
    ep, tp, dp, cp = par.ep, par.tp, par.dp, par.cp
    if ep == 1 and (tp == 1 or dp * cp == 1):
        return None
    if cp == 1 and (ep == tp or (tp == 1 and ep == dp)):
        return None
    return (f"parallel.ep = {ep} with tp = {tp}, dp = {dp}, cp = {cp} gives expert groups "
            "that are not shifts of one another (experts fold with ep = tp or tp = 1 and "
            "ep = dp, without CP; or ep = 1 with tp = 1 or dp x cp = 1)")


def _dp_group(s: GridShape, p: int) -> list[int]:
    """The group gradients are reduced over, of TP rank 0 of stage p: DP x CP (members
    c + cp d; DP alone when cp = 1)."""
    return [s.rank_of(0, j // s.cp, p, j % s.cp) for j in range(s.cp * s.dp)]


def _far_neighbours(net: Network, group: list[int]) -> bool:
    """Whether some ring lane of the group passes between members not adjacent in its
    order (`comm.mirror.RingMirror` pairs offsets +1 and -1 only)."""
    n = len(group)
    return any((o[(i + 1) % n] - o[i]) % n not in (1, n - 1)
               for o in orders_of(net, group, True) for i in range(n))


def _signature(net: Network, a: int, b: int) -> tuple[object, ...]:
    h = net.hop(a, b)
    return (h.transport, h.inter_node, h.hops, h.ingress is None)


def _network_obstacle(net: Network, fold: Fold, ranks: list[int] | None) -> str | None:
    """The first route that changes under a symmetry of a (CP rank, stage) (None: none
    does)."""
    images = fold.images()[1:]
    for m in range(fold.launch) if ranks is None else ranks:
        bad = _broken(net, images, _orbits(fold.shape, _pairs(net, fold, m)))
        if bad is not None:
            (a, b), (ga, gb) = bad
            c, p = fold.place(m)
            where = f"stage {p}" + (f", CP rank {c}" if fold.shape.cp > 1 else "")
            return (f"the network is not the same from every rank of {where}: the route "
                    f"{a}->{b} and its image {ga}->{gb} differ (hierarchical nodes that cut "
                    "a TP or DP group unevenly)")
    return None


def _ring_pairs(net: Network, group: list[int]) -> list[tuple[int, int]]:
    """The neighbour pairs of a group's ring lanes, both ways (the only routes a mirrored
    group's collectives take: `comm.ring.orders_of`)."""
    return [(group[o[i]], group[o[(i + 1) % len(o)]]) for o in orders_of(net, group, True)
            for i in range(len(o)) if len(o) > 1]


def _pairs(net: Network, fold: Fold, m: int) -> list[tuple[int, int]]:
    """The routes whose images must match for MPI rank m's representative: inside its TP
    group, along its DP group's rings, to and from its CP and DP x CP peers and the other
    stages' representatives of its CP rank."""
    s, rep, (c, p) = fold.shape, fold.rep(m), fold.place(m)
    tp = [s.rank_of(t, 0, p, c) for t in range(s.tp)]
    pairs = [(a, b) for a in tp for b in tp if a != b]
    pairs += _ring_pairs(net, [s.rank_of(0, d, p, c) for d in range(s.dp)])
    peers = [s.rank_of(0, 0, k, c) for k in range(s.pp) if k != p]
    peers += [s.rank_of(i % s.tp, i // s.tp, p, c) for i in range(1, s.ep)]  # the EP group
    if s.cp > 1:
        peers += [x for x in _dp_group(s, p) if x != rep]     # the CP group's among them
    return pairs + [pair for x in peers for pair in ((rep, x), (x, rep))]


def _orbits(s: GridShape, pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """One pair per orbit under the images' shifts: (a, b) moved so that a sits at TP and
    DP rank 0 (a DP ring's pairs (d, d + 1) are all one orbit; checking every image of one
    of them checks them all)."""
    out: dict[tuple[int, int], None] = {}
    for a, b in pairs:
        (ta, da, pa), (tb, db, pb) = s.coords(a), s.coords(b)
        out.setdefault((s.rank_of(0, 0, pa, s.cp_rank(a)),
                        s.rank_of((tb - ta) % s.tp, (db - da) % s.dp, pb, s.cp_rank(b))))
    return list(out)


def _broken(net: Network, images: list[Callable[[int], int]], pairs: list[tuple[int, int]]
            ) -> tuple[tuple[int, int], tuple[int, int]] | None:
    for a, b in pairs:
        sig = _signature(net, a, b)
        for g in images:
            if _signature(net, g(a), g(b)) != sig:
                return (a, b), (g(a), g(b))
    return None


def _launch_words(w: Workload) -> tuple[int, str, str]:
    """A folded job's size, the fields it is made of, and what each rank plays."""
    cp, pp = w.parallel.cp, w.parallel.pp
    if cp == 1:
        return pp, f"parallel.pp = {pp}", "one per pipeline stage"
    return (cp * pp, f"parallel.cp*parallel.pp = {cp}*{pp} = {cp * pp}",
            "one per context-parallel rank of each pipeline stage")


def plan_fold(w: Workload, world_size: int, ranks: list[int] | None = None) -> Fold | None:
    """The job's fold (None: every emulated rank is an MPI rank); a launch that fits
    neither, or a fold that would not be exact, is refused in one line (`ranks`: the MPI
    ranks whose representatives' symmetry to check; default all)."""
    resolve_network(w, resolve_device(w, 0))        # a bad value there is named first
    par = w.parallel
    full, mode = par.devices, w.run.fold
    launch, fields, each = _launch_words(w)
    if world_size == full and (mode != "on" or full == launch):
        return None
    if mode == "on" and world_size != launch:
        raise ConfigError("run.fold", mode, f"a job of {fields} ranks ({each}); this one "
                          f"has {world_size}")
    if mode == "off" or world_size != launch:
        hint = "" if mode == "off" or full == launch else (
            f", or {launch} ({each}) with run.fold = \"auto\" in timing-only runs")
        raise ConfigError(par.grid_field, par.grid_value,
                          f"must equal the {world_size} ranks of this job{hint}")
    why = obstacle(w, ranks)
    if why is not None:
        raise ConfigError("run.fold", mode, f"exact folding only; here {why}: launch "
                          f"{full} ranks to run every emulated GPU")
    return Fold(GridShape(par.tp, par.dp, par.pp, par.cp, par.ep))

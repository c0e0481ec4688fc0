"""Whether a partition into classes of images (`comm.shape.Fold`) is exact (docs/folding.md).

A class's members are its representative shifted by (i a, j b) in (TP, DP). The partition
is exact when every such shift maps what the representative does onto what the member does:

1. **groups**: each group of the representative goes onto a group of the member, its ranks
   rotated (offsets inside a group are what `comm.folded.FoldedComm` pairs messages by);
2. **routes**: every route the representative's groups use (inside its TP, CP and EP
   groups, along its DP groups' ring lanes, through a hierarchical all-reduce's nodes and
   rails, all pairs of a group that may run a tree, to the other stages) keeps its
   transport, node crossing and hop count;
3. **lanes**: a group with images of this rank has ring lanes that pair every member with
   its successor at the same offset as in the shifted group;
4. **algorithms**: a group with images of this rank runs no algorithm whose members play
   different roles (NCCL's trees), wherever NCCL's tuner may pick one for it.

No MPI here: every process computes the same partition.
"""
from __future__ import annotations

import numpy as np

from ..comm.folded import MIRRORED_ALGORITHMS
from ..comm.ring import orders_of
from ..comm.shape import Fold, GridShape
from ..comm.tree import edges
from ..comm.tuner import allowed_on, node_groups
from ..config.workload import Workload, resolve_device
from ..net import Network
from .moe_setup import model_of

# groups that all-reduce in a train step, and which reduce-scatter instead under ZeRO
REDUCING = ("tp", "dp", "dp_cp", "edp")
SHARDED = ("dp", "dp_cp", "edp")


def classes_obstacle(w: Workload, net: Network, fold: Fold) -> str | None:
    """Why this partition would not be exact (None: it is)."""
    shape, kinds = fold.shape, _kinds(fold.shape)
    images = _images_here(fold, kinds)
    for kind in kinds:                 # the cheap refusal first: an algorithm with roles
        why = _algorithm(w, net, fold, kind) if images[kind] else None
        if why:
            return why
    for kind in kinds:
        for members in shape.every_group(kind) if images[kind] else []:
            why = _rotation(shape, fold, kind, members) or _lanes(net, shape, fold, kind,
                                                                  members)
            if why:
                return why
    pairs: dict[tuple[int, int], None] = {}
    seen: set[tuple[object, ...]] = set()
    for m in range(fold.launch):         # every group a representative is in, once
        for kind in kinds:
            key = (kind, *shape.group_key(kind, fold.rep(m)))
            if key not in seen:
                seen.add(key)
                members = shape.group(kind, fold.rep(m))
                pairs.update(dict.fromkeys(_orbit(fold, x, y)
                                           for x, y in _pairs(w, net, kind, members)))
    return _routes(net, fold, list(pairs))


def _kinds(s: GridShape) -> list[str]:
    """The groups a run builds (`comm.grid`)."""
    out = ["tp", "dp", "pp"] + (["cp", "dp_cp"] if s.cp > 1 else [])
    experts = (["ep"] if s.ep > 1 else []) + (["etp", "etp_ep"] if s.etp > 1 else [])
    return out + (experts + ["edp"] if experts else [])


def _images_here(fold: Fold, kinds: list[str]) -> dict[str, bool]:
    """Per kind: whether its groups hold images of one another (some class twice; all
    groups of a kind alike, the partition being a symmetry)."""
    out = {}
    for kind in kinds:
        procs = [fold.proc(x) for x in fold.shape.group(kind, fold.rep(0))]
        out[kind] = len(set(procs)) < len(procs)
    return out


def _generators(fold: Fold) -> list[tuple[int, int]]:
    """The shifts every shift of a class is made of (checking them on every group of the
    world checks all their sums)."""
    s = fold.shape
    return [g for g in ((fold.tp_classes, 0), (0, fold.dp_classes))
            if g != (s.tp, 0) and g != (0, s.dp)]


def _rotation(s: GridShape, fold: Fold, kind: str, members: list[int]) -> str | None:
    for a, b in _generators(fold):
        img = [s.shift(x, a, b) for x in members]
        other = s.group(kind, img[0])
        k = other.index(img[0])
        if any(other[(i + k) % len(other)] != x for i, x in enumerate(img)):
            return (f"the {kind} group {members[:8]} shifted by (tp {a}, dp {b}) is not "
                    f"one of the {kind} groups in the same order")
    return None


def _mirrored_only(w: Workload, kind: str) -> bool:
    """Whether a group of this kind runs only algorithms exact on images (rings, NVLS)."""
    if w.collectives.algorithm:
        return w.collectives.algorithm in MIRRORED_ALGORITHMS
    if kind in ("dp", "dp_cp") and _bias_counts(w):
        return False                    # DeepSeek-V3's expert bias: a small all-reduce
    if kind in SHARDED and w.optimizer.zero >= 1:
        return True                     # reduce-scatter and all-gather: rings
    return kind not in REDUCING


def _bias_counts(w: Workload) -> bool:
    """Whether each step all-reduces the experts' routed counts over DP (expert bias)."""
    moe = model_of(w).moe
    return moe is not None and moe.expert_bias


def _algorithm(w: Workload, net: Network, fold: Fold, kind: str) -> str | None:
    if _mirrored_only(w, kind):
        return None
    members = fold.shape.group(kind, fold.rep(0))
    roles = [a for a in allowed_on(net, members, "all_reduce") if a not in MIRRORED_ALGORITHMS]
    calls = _whole_buffer_calls(w) if kind in SHARDED and roles else None
    if calls is not None:          # the sizes are known: what NCCL's tuner picks for them
        roles = [a for p, nbytes, itemsize in calls
                 if (a := _picked(w, net, fold.shape.group(kind, fold.rep(
                     fold.classes.rank_of(0, 0, p))), nbytes, itemsize))
                 not in MIRRORED_ALGORITHMS]
    if not roles:
        return None
    return (f"NCCL may run the {kind} group's all-reduce as a {roles[0]} (whose ranks play "
            "different roles), so its ranks cannot be images of one another (optimizer.zero "
            "= 1 or collectives.algorithm = \"ring\" keep them images)")


def _whole_buffer_calls(w: Workload) -> list[tuple[int, float, int]] | None:
    """(stage, bytes, bytes per element) of the one DP all-reduce per stage and step of a
    dense `train` run under local DDP (the whole gradient buffer after backward,
    `training.gradients`); None where calls of other sizes may come (core DDP's buckets)."""
    if w.run.kind != "train" or w.train.ddp != "local" or w.optimizer.zero != 0:
        return None
    from ..devices.specs import dtype_bytes  # noqa: PLC0415
    from ..model.stage import stage_params  # noqa: PLC0415
    from .train_setup import grad_buffer, resolve  # noqa: PLC0415
    cfg, _, dims = resolve(w)
    if cfg.moe is not None:
        return None
    buf = grad_buffer(w, resolve_device(w).kind)
    itemsize = buf.main if buf is not None else dtype_bytes(w.run.emulated_dtype)
    par = w.parallel
    return [(p, itemsize * sum(lp.size for lp in stage_params(
        cfg, dims.tp, par.pp, par.virtual_stages, p, par.split)), itemsize)
        for p in range(par.pp)]


def _picked(w: Workload, net: Network, members: list[int], nbytes: float, itemsize: int
            ) -> str:
    """The algorithm a DP all-reduce of this size runs on this group (`call_for`)."""
    from ..comm.collectives import call_for  # noqa: PLC0415
    from ..comm.folded import FoldedComm  # noqa: PLC0415
    from ..comm.p2p import TimedComm, Tuning  # noqa: PLC0415
    from ..sim.timeline import Timeline  # noqa: PLC0415
    tc = TimedComm(FoldedComm.images("dp", 0, members), Timeline(), net, "dp",
                   devices=members,
                   tuning=Tuning(w.collectives.algorithm, w.collectives.protocol))
    return call_for(tc, "all_reduce", nbytes, itemsize, w.overlap.bidirectional)[0].algorithm


def _successors(net: Network, members: list[int]) -> list[dict[int, int]]:
    """Per ring lane: each member's successor, as an offset (the lanes depend only on
    which members share a node: remembered per such pattern)."""
    nodes = [net.node_of(x) for x in members]
    first: dict[int, int] = {}
    key = tuple(first.setdefault(v, len(first)) for v in nodes)
    got = _SUCCESSORS.get(key)
    if got is None:
        n = len(members)
        got = _SUCCESSORS[key] = [{o[i]: (o[(i + 1) % n] - o[i]) % n for i in range(n)}
                                  for o in orders_of(net, members, True)]
    return got


_SUCCESSORS: dict[tuple[int, ...], list[dict[int, int]]] = {}


def _lanes(net: Network, s: GridShape, fold: Fold, kind: str, members: list[int]
           ) -> str | None:
    if kind not in REDUCING:
        return None
    n, mine = len(members), _successors(net, members)
    for a, b in _generators(fold):
        img = [s.shift(x, a, b) for x in members]
        other = s.group(kind, img[0])
        k = other.index(img[0])
        theirs = _successors(net, other)
        if len(theirs) != len(mine) or any(
                mine[j][i] != theirs[j][(i + k) % n] for j in range(len(mine))
                for i in range(n)):
            return (f"the {kind} group's ring lanes pair its members differently once "
                    f"shifted by (tp {a}, dp {b}) (a shift that does not move whole nodes)")
    return None


def _ring_pairs(net: Network, members: list[int]) -> list[tuple[int, int]]:
    n = len(members)
    return [(members[o[i]], members[o[(i + 1) % n]]) for o in orders_of(net, members, True)
            for i in range(n)] if n > 1 else []


def _all_pairs(members: list[int]) -> list[tuple[int, int]]:
    return [(x, y) for x in members for y in members if x != y]


def _tree_pairs(groups: list[list[int]], members: list[int]) -> list[tuple[int, int]]:
    """Both ways along every edge of NCCL's trees over these node groups (`comm.tree`)."""
    pairs = [(members[a], members[b]) for a, b in edges(groups)]
    return pairs + [(y, x) for x, y in pairs]


def _pairs(w: Workload, net: Network, kind: str, members: list[int]
           ) -> list[tuple[int, int]]:
    """The routes a group of this kind may take."""
    if kind in ("tp", "cp", "ep", "etp", "etp_ep"):
        return _all_pairs(members)
    if kind in ("pp", "mp"):
        return _ring_pairs(net, members)
    out = _ring_pairs(net, members)
    algos = allowed_on(net, members, "all_reduce") if len(members) > 1 else []
    nodes = [[members[i] for i in g] for g in node_groups(net, members)] if algos else []
    rails = [[g[j] for g in nodes] for j in range(len(nodes[0]))] if nodes else []
    if "hierarchical" in algos:
        out += [p for g in nodes + rails for p in _ring_pairs(net, g)]
    if not _mirrored_only(w, kind):
        if "tree" in algos:
            out += _tree_pairs(node_groups(net, members), members)
        if "nvls_tree" in algos:
            out += [p for r in rails for p in _tree_pairs([[i] for i in range(len(r))], r)]
    return out


def _orbit(fold: Fold, x: int, y: int) -> tuple[int, int]:
    """The pair (x, y) shifted so that x is its class's representative (one pair per orbit
    under the class's shifts)."""
    s = fold.shape
    t, d, _ = s.coords(x)
    a, b = t - t % fold.tp_classes, d - d % fold.dp_classes
    return s.shift(x, -a, -b), s.shift(y, -a, -b)


def _routes(net: Network, fold: Fold, pairs: list[tuple[int, int]]) -> str | None:
    """The first pair whose route class (`Network.route_class`) some shift changes; the
    shifts of all pairs at once, a block of pairs at a time."""
    s, shifts = fold.shape, np.array(fold.shifts()[1:], np.int64).reshape(-1, 2)
    if not len(shifts) or not pairs:
        return None
    if net.spec.fabric == "ring":            # hops inside a node: one pair at a time
        return _routes_one_by_one(net, fold, pairs)
    g = net.per_node
    block = max(1, 2 ** 22 // len(shifts))
    for lo in range(0, len(pairs), block):
        xy = np.array(pairs[lo:lo + block], np.int64)
        moved = _shifted(s, xy, shifts) // g                     # [pairs, 2, shifts]
        crosses = moved[:, 0] != moved[:, 1]
        base = (xy[:, 0] // g != xy[:, 1] // g)[:, None]
        bad = np.argwhere(crosses != base)
        if len(bad):
            i, k = (int(v) for v in bad[0])
            (x, y), (a, b) = pairs[lo + i], shifts[k]
            return (f"the route {x}->{y} and its image {s.shift(x, a, b)}->{s.shift(y, a, b)} "
                    "differ (nodes that cut a TP or DP group unevenly)")
    return None


def _shifted(s: GridShape, ranks: np.ndarray, shifts: np.ndarray) -> np.ndarray:
    """`GridShape.shift` of every rank by every shift: ranks [...] -> [..., shifts]."""
    r = ranks[..., None]
    t, d = r % s.tp, r // (s.tp * s.cp) % s.dp
    rest = r - t - s.tp * s.cp * d
    return (t + shifts[:, 0]) % s.tp + s.tp * s.cp * ((d + shifts[:, 1]) % s.dp) + rest


def _routes_one_by_one(net: Network, fold: Fold, pairs: list[tuple[int, int]]
                       ) -> str | None:
    s = fold.shape
    for x, y in pairs:
        sig = net.route_class(x, y)
        for a, b in fold.shifts()[1:]:
            gx, gy = s.shift(x, a, b), s.shift(y, a, b)
            if net.route_class(gx, gy) != sig:
                return (f"the route {x}->{y} and its image {gx}->{gy} differ (nodes that cut "
                        "a TP or DP group unevenly)")
    return None

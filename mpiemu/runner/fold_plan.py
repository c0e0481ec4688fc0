"""`run.fold`: whether a job runs one MPI rank per emulated GPU or one per class of images.

A job launched with tp x cp x dp x pp ranks runs every emulated rank. A job launched with
fewer, `run.fold = "auto"` or `"on"`, runs one rank per class of exact images
(`comm.shape.Fold`, `comm.folded`) when folding can be exact at all:

* timing only (`run.numerics = "off"`): real values differ between replicas;
* a `train` or `layer_sweep` run, every rank on the same device, no injected fault on one
  rank, no hybrid sharding, experts under perfect balance, no ring fabric across groups.

The classes are the coarsest partition by TP and DP shifts that `runner.fold_classes`
finds exact (groups, routes, ring lanes and NCCL's algorithms all kept by every shift); the
launch must have one rank per class, and a refusal says how many that is. Cases only the run
itself meets (a collective over a length its group does not divide) raise `FoldError` on the
first such call, naming it.
"""
from __future__ import annotations

from ..comm.shape import Fold, GridShape
from ..config.workload import Workload, resolve_device, resolve_network
from ..config.errors import ConfigError
from .fold_classes import classes_obstacle
from .moe_setup import model_of

# kinds whose ranks differ only by their place in the grid (layer_sweep: thesis ch. 5 to TP 256)
FOLDABLE_KINDS = ("train", "layer_sweep")


def obstacle(w: Workload) -> str | None:
    """Why folding this workload cannot be exact whatever its classes (None: it can)."""
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
    shape = shape_of(w)
    if w.network_of(shape.size).spec.fabric == "ring" and shape.size > shape.tp:
        return ("a ring fabric with CP, DP or PP groups (their messages cross other devices' "
                "links, which traces name only by the first)")
    return None


def shape_of(w: Workload) -> GridShape:
    par = w.parallel
    return GridShape(par.tp, par.dp, par.pp, par.cp, par.ep, par.etp)


def _experts_obstacle(w: Workload) -> str | None:
    """Experts fold under perfect balance only (their groups are checked as every group)."""
    if model_of(w).moe is None:
        return None
    src = w.moe.source(False)
    if src != "balanced":
        return (f"moe.tokens = {src!r} sends different tokens from each rank (only perfect "
                "balance, 'balanced', folds)")
    return None


def classes(w: Workload) -> tuple[Fold, str]:
    """The coarsest exact partition into classes of images (`comm.shape.Fold`): TP and DP
    shifts by multiples of (a, b), a | tp, b | dp, the fewest classes first; and why the
    coarser ones were refused ('' when every TP x DP rank of a (CP rank, stage) is an image)."""
    shape = shape_of(w)
    net = w.network_of(shape.size)
    cands = sorted(((a, b) for a in _divisors(shape.tp) for b in _divisors(shape.dp)
                    if a * b < shape.tp * shape.dp), key=lambda ab: (ab[0] * ab[1], ab[0]))
    why = ""
    for a, b in cands:
        fold = Fold(shape, a, b, why)
        bad = classes_obstacle(w, net, fold)
        if bad is None:
            return fold, why
        why = why or bad
    return Fold(shape, shape.tp, shape.dp, why), why     # every rank its own class


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]

def describe(fold: Fold) -> str:
    """What the folded job's processes are, in words (and why there are that many)."""
    s, per = fold.shape, fold.tp_classes * fold.dp_classes
    where = "(CP rank, stage)" if s.cp > 1 else "stage"
    if per == 1:
        return f"one per {where}"
    return (f"{per} per {where}, its TP x DP ranks in {fold.tp_classes} x "
            f"{fold.dp_classes} classes of exact images: {fold.why}")


def plan_fold(w: Workload, world_size: int) -> Fold | None:
    """The job's fold (None: every emulated rank is an MPI rank); a launch that fits
    neither, or a fold that would not be exact, is refused in one line."""
    resolve_network(w, resolve_device(w, 0))        # a bad value there is named first
    par = w.parallel
    full, mode = par.devices, w.run.fold
    if world_size == full and mode != "on":
        return None
    if mode == "off":
        raise ConfigError(par.grid_field, par.grid_value,
                          f"must equal the {world_size} ranks of this job")
    why = obstacle(w)
    fold, split = classes(w) if why is None else (None, "")
    if fold is not None and fold.launch == full:
        why = f"no two emulated GPUs are exact images ({split})"
    tried = world_size < full and w.run.kind in FOLDABLE_KINDS    # a fold, by its size
    if why is not None and (mode == "on" or tried):
        raise ConfigError("run.fold", mode, f"exact folding only; here {why}: launch "
                          f"{full} ranks to run every emulated GPU")
    if mode == "on" and fold is not None and world_size != fold.launch:
        raise ConfigError("run.fold", mode, f"a job of {fold.launch} ranks ({describe(fold)})"
                          f"; this one has {world_size}")
    if fold is not None and world_size == fold.launch:
        return fold
    hint = "" if fold is None else (
        f", or {fold.launch} ({describe(fold)}) with run.fold = \"auto\" in timing-only "
        "runs")
    raise ConfigError(par.grid_field, par.grid_value,
                      f"must equal the {world_size} ranks of this job{hint}")

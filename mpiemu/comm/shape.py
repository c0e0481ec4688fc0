"""The TP x CP x DP x PP grid as arithmetic: coordinates of a rank, and folding's images.

No MPI here (analysis expands folded traces with it in a process that may have none).
Ranks are laid out tensor-parallel fastest, then context-parallel, data-parallel, pipeline
(Megatron-Core's default order "tp-cp-dp-pp", megatron/core/parallel_state.py
`RankGenerator`): rank = tp_rank + tp (cp_rank + cp (dp_rank + dp pp_rank)); `comm.grid`
has the worked example.
Folding (docs/folding.md): in a timing-only run on identical devices, ranks that a shift of
the TP and DP coordinates connects can be exact images of each other; `Fold` names the
classes of such images and the process that plays each.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple


@dataclass(frozen=True)
class GridShape:
    """tp x cp x dp x pp must equal the world size; ranks in Megatron-Core's order
    "tp-cp-dp-pp": rank = tp_rank + tp (cp_rank + cp (dp_rank + dp pp_rank))."""

    tp: int
    dp: int
    pp: int = 1
    cp: int = 1
    ep: int = 1          # expert parallelism: regroups a stage's tp x cp x dp ranks
    etp: int = 1         # expert tensor parallelism: each expert's FFN split over etp ranks

    def __post_init__(self) -> None:
        for name, v in (("parallel.tp", self.tp), ("parallel.dp", self.dp),
                        ("parallel.pp", self.pp), ("parallel.cp", self.cp),
                        ("parallel.ep", self.ep), ("parallel.etp", self.etp)):
            if v < 1:
                raise ValueError(f"{name}={v} must be >= 1")

    @property
    def size(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(tp_rank, dp_rank, pp_rank) of a world rank (its CP rank: `cp_rank`)."""
        inner = self.tp * self.cp
        return rank % self.tp, rank // inner % self.dp, rank // (inner * self.dp)

    def cp_rank(self, rank: int) -> int:
        """The context-parallel rank of a world rank."""
        return rank // self.tp % self.cp

    def expert_place(self, rank: int) -> tuple[int, int, int]:
        """(expert TP rank, EP rank, expert-DP rank) of a world rank: a stage's tp x cp x dp
        ranks regrouped expert TP fastest, then EP, then expert DP (Megatron-Core's MoE
        parallel folding: its expert RankGenerator "tp-ep-dp-pp" with tp = etp)."""
        inner = rank % (self.tp * self.cp * self.dp)
        return inner % self.etp, inner // self.etp % self.ep, inner // (self.etp * self.ep)

    def rank_of(self, tp_rank: int, dp_rank: int, pp_rank: int, cp_rank: int = 0) -> int:
        return tp_rank + self.tp * (cp_rank + self.cp * (dp_rank + self.dp * pp_rank))

    def shift(self, rank: int, a: int, b: int) -> int:
        """The rank `a` TP places and `b` DP places on from `rank` (cyclically)."""
        t, d, p = self.coords(rank)
        return self.rank_of((t + a) % self.tp, (d + b) % self.dp, p, self.cp_rank(rank))

    def shifter(self, a: int, b: int) -> Callable[[int], int]:
        """`shift` by (a, b) as a map of devices."""
        return lambda rank: self.shift(rank, a, b)

    def image_map(self, rep: int, member: int) -> Callable[[int], int]:
        """Map a device as `rep` sees it to the device `member` sees there (member is rep
        shifted in TP and DP)."""
        (tr, dr, _), (tm, dm, _) = self.coords(rep), self.coords(member)
        return self.shifter(tm - tr, dm - dr)

    def groups(self, rank: int) -> dict[str, list[int]]:
        """The members of each group of `rank`, in group-rank order (`comm.grid` splits the
        same): tp, cp, dp, dp_cp (gradients), pp, mp (model-parallel), etp (expert tensor
        parallel), ep, etp_ep (both: Megatron-Core's expert tensor-and-model-parallel group)
        and edp (expert data parallel: the stage's ranks holding the same expert slices)."""
        return {k: self.group(k, rank) for k in GROUPS}

    def group(self, kind: str, rank: int) -> list[int]:
        """The members of `rank`'s group of this kind (`groups`)."""
        t, d, p = self.coords(rank)
        c, n = self.cp_rank(rank), self.tp * self.cp * self.dp
        if kind == "tp":
            return [self.rank_of(i, d, p, c) for i in range(self.tp)]
        if kind == "cp":
            return [self.rank_of(t, d, p, j) for j in range(self.cp)]
        if kind == "dp":
            return [self.rank_of(t, j, p, c) for j in range(self.dp)]
        if kind == "dp_cp":
            return [self.rank_of(t, j // self.cp, p, j % self.cp)
                    for j in range(self.cp * self.dp)]
        if kind == "pp":
            return [self.rank_of(t, d, k, c) for k in range(self.pp)]
        if kind == "mp":
            return [self.rank_of(i, d, k, c) for k in range(self.pp) for i in range(self.tp)]
        j, e, k = self.expert_place(rank)
        base, em = p * n, self.etp * self.ep
        if kind == "etp":
            return [base + i + self.etp * (e + self.ep * k) for i in range(self.etp)]
        if kind == "ep":
            return [base + j + self.etp * (i + self.ep * k) for i in range(self.ep)]
        if kind == "etp_ep":
            return [base + em * k + i for i in range(em)]
        return [base + j + self.etp * e + em * i for i in range(n // em)]       # edp

    def group_key(self, kind: str, rank: int) -> tuple[int, ...]:
        """What names `rank`'s group of this kind among the others (no member listed)."""
        t, d, p = self.coords(rank)
        c = self.cp_rank(rank)
        j, e, k = self.expert_place(rank)
        return {"tp": (c, d, p), "cp": (t, d, p), "dp": (t, c, p), "dp_cp": (t, p),
                "pp": (t, c, d), "mp": (c, d), "etp": (p, e, k), "ep": (p, j, k),
                "etp_ep": (p, k), "edp": (p, j, e)}[kind]

    def every_group(self, kind: str) -> list[list[int]]:
        """Every group of this kind in the world, each once."""
        seen: set[int] = set()
        out = []
        for r in range(self.size):
            if r not in seen:
                out.append(self.group(kind, r))
                seen.update(out[-1])
        return out


GROUPS = ("tp", "cp", "dp", "dp_cp", "pp", "mp", "etp", "ep", "etp_ep", "edp")


class Fold(NamedTuple):
    """The emulated grid `shape` run on one MPI rank per class of exact images
    (docs/folding.md). Shifting every device's (tp, dp) coordinates by a multiple of
    (`tp_classes`, `dp_classes`) maps the grid, and (checked by `runner.fold_plan`) the
    network and every group's messages, onto themselves; the ranks such shifts connect are
    one class. Class (t0, c, d0, p), t0 < tp_classes, d0 < dp_classes, is played by MPI rank
    t0 + tp_classes (c + cp (d0 + dp_classes p)) (`classes`: the grid of the processes),
    whose representative is emulated rank (t0, c, d0, p). CP ranks are never images of each
    other (different sequence chunks, different causal work)."""

    shape: GridShape
    tp_classes: int = 1
    dp_classes: int = 1
    why: str = ""             # what kept coarser classes from being exact ('' if none)

    @property
    def classes(self) -> GridShape:
        """The grid of the folded job's processes."""
        s = self.shape
        return GridShape(self.tp_classes, self.dp_classes, s.pp, s.cp)

    @property
    def launch(self) -> int:
        """MPI ranks of the folded job: one per class."""
        return self.classes.size

    def rep(self, mpi_rank: int) -> int:
        """The emulated rank MPI rank `mpi_rank` plays."""
        t, d, p = self.classes.coords(mpi_rank)
        return self.shape.rank_of(t, d, p, self.classes.cp_rank(mpi_rank))

    def proc(self, rank: int) -> int:
        """The MPI rank that plays emulated rank `rank` (its class's)."""
        s, (t, d, p) = self.shape, self.shape.coords(rank)
        return self.classes.rank_of(t % self.tp_classes, d % self.dp_classes, p,
                                    s.cp_rank(rank))

    def shifts(self) -> list[tuple[int, int]]:
        """Every (tp, dp) shift that maps a class onto itself (the identity first)."""
        s = self.shape
        return [(a, b) for b in range(0, s.dp, self.dp_classes)
                for a in range(0, s.tp, self.tp_classes)]

    def members(self, mpi_rank: int) -> list[int]:
        """The emulated ranks MPI rank `mpi_rank` stands for (its own first)."""
        rep = self.rep(mpi_rank)
        return [self.shape.shift(rep, a, b) for a, b in self.shifts()]

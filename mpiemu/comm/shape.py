"""The TP x CP x DP x PP grid as arithmetic: coordinates of a rank, and folding's images.

No MPI here (analysis expands folded traces with it in a process that may have none).
Ranks are laid out tensor-parallel fastest, then context-parallel, data-parallel, pipeline
(Megatron-Core's default order "tp-cp-dp-pp", megatron/core/parallel_state.py
`RankGenerator`): rank = tp_rank + tp (cp_rank + cp (dp_rank + dp pp_rank)); `comm.grid`
has the worked example.
Folding (docs/folding.md): in a timing-only run on identical devices, the TP x DP ranks of one
(CP rank, pipeline stage) are images of each other; `Fold` names them and maps a device as
the representative sees it to the device an image sees there.
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


    def __post_init__(self) -> None:
        for name, v in (("parallel.tp", self.tp), ("parallel.dp", self.dp),
                        ("parallel.pp", self.pp), ("parallel.cp", self.cp),
                        ("parallel.ep", self.ep)):
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

    def expert_place(self, rank: int) -> tuple[int, int]:
        """(EP rank, expert-DP rank) of a world rank: a stage's tp x cp x dp ranks regrouped
        EP fastest, then expert DP (Megatron-Core's MoE parallel folding, expert tensor
        parallelism 1: its expert RankGenerator "tp-ep-dp-pp" with etp = 1)."""
        inner = rank % (self.tp * self.cp * self.dp)
        return inner % self.ep, inner // self.ep

    def rank_of(self, tp_rank: int, dp_rank: int, pp_rank: int, cp_rank: int = 0) -> int:
        return tp_rank + self.tp * (cp_rank + self.cp * (dp_rank + self.dp * pp_rank))


class Fold(NamedTuple):
    """The emulated grid `shape` run on one MPI rank per (CP rank, pipeline stage): MPI rank
    m plays emulated rank (t=0, c=m % cp, d=0, p=m // cp) and stands for every (t, c, d, p).
    CP ranks are not images of each other (different sequence chunks, different causal
    work); the TP and DP ranks of one (c, p) are."""

    shape: GridShape

    @property
    def launch(self) -> int:
        """MPI ranks of the folded job: cp x pp."""
        return self.shape.cp * self.shape.pp

    def place(self, mpi_rank: int) -> tuple[int, int]:
        """(cp rank, stage) that MPI rank `mpi_rank` plays."""
        return mpi_rank % self.shape.cp, mpi_rank // self.shape.cp

    def rep(self, mpi_rank: int) -> int:
        """The emulated rank MPI rank `mpi_rank` plays."""
        c, p = self.place(mpi_rank)
        return self.shape.rank_of(0, 0, p, c)

    def members(self, mpi_rank: int) -> list[int]:
        """The emulated ranks MPI rank `mpi_rank` stands for (its own first)."""
        s, (c, p) = self.shape, self.place(mpi_rank)
        return [s.rank_of(t, d, p, c) for d in range(s.dp) for t in range(s.tp)]

    def image(self, member: int) -> Callable[[int], int]:
        """Map a device as the representative sees it to the device `member` sees there:
        (t, c, d, p) -> (t + a, c, d + b, p) for member (a, ., b, .)."""
        s = self.shape
        a, b, _ = s.coords(member)

        def f(device: int) -> int:
            t, d, p = s.coords(device)
            return s.rank_of((t + a) % s.tp, (d + b) % s.dp, p, s.cp_rank(device))
        return f

    def images(self) -> list[Callable[[int], int]]:
        """Every symmetry of one (CP rank, stage) (the identity first)."""
        return [self.image(m) for m in self.members(0)]

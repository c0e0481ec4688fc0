"""The TP x DP x PP process grid: sub-communicators for each group.

Ranks are laid out tensor-parallel fastest, then data-parallel, then pipeline (Megatron-LM's
default order "tp-dp-pp", megatron/core/parallel_state.py `RankGenerator`):
rank = tp_rank + tp * (dp_rank + dp * pp_rank). Worked example, 8 ranks, tp=2, dp=2, pp=2:

    rank:       0  1  2  3  4  5  6  7
    tp_rank:    0  1  0  1  0  1  0  1
    dp_rank:    0  0  1  1  0  0  1  1
    pp_rank:    0  0  0  0  1  1  1  1
    TP groups:        [0, 1], [2, 3], [4, 5], [6, 7]   (one node's GPUs: the fast links)
    DP groups:        [0, 2], [1, 3], [4, 6], [5, 7]   (same weights, different data)
    PP groups:        [0, 4], [1, 5], [2, 6], [3, 7]   (stage 0 -> stage 1)
    embedding groups: [0, 4], [1, 5], [2, 6], [3, 7]   (first and last stage: tied wte)
    model-parallel:   [0, 1, 4, 5], [2, 3, 6, 7]       (one replica: the gradient norm)

With pp = 1 the embedding group is the rank alone (the table is not duplicated).
"""
from __future__ import annotations

from dataclasses import dataclass

from mpi4py import MPI


@dataclass(frozen=True)
class GridShape:
    """tp x dp x pp must equal the world size."""

    tp: int
    dp: int
    pp: int = 1

    def __post_init__(self) -> None:
        for name, v in (("parallel.tp", self.tp), ("parallel.dp", self.dp),
                        ("parallel.pp", self.pp)):
            if v < 1:
                raise ValueError(f"{name}={v} must be >= 1")

    @property
    def size(self) -> int:
        return self.tp * self.dp * self.pp

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(tp_rank, dp_rank, pp_rank) of a world rank."""
        return rank % self.tp, rank // self.tp % self.dp, rank // (self.tp * self.dp)

    def rank_of(self, tp_rank: int, dp_rank: int, pp_rank: int) -> int:
        return tp_rank + self.tp * (dp_rank + self.dp * pp_rank)


class ProcessGrid:
    """World communicator split into TP, DP, PP, embedding and model-parallel groups
    (communicators passed, never global)."""

    def __init__(self, world: MPI.Comm, shape: GridShape) -> None:
        if world.Get_size() != shape.size:
            raise ValueError(f"parallel.tp*parallel.dp*parallel.pp = {shape.tp}*{shape.dp}*"
                             f"{shape.pp} = {shape.size} but the job has {world.Get_size()} "
                             "ranks")
        self.world = world
        self.shape = shape
        self.rank = world.Get_rank()
        self.tp_rank, self.dp_rank, self.pp_rank = shape.coords(self.rank)
        t, d, p = self.tp_rank, self.dp_rank, self.pp_rank
        self.tp_comm = world.Split(color=d + shape.dp * p, key=t)
        self.dp_comm = world.Split(color=t + shape.tp * p, key=d)
        self.pp_comm = world.Split(color=t + shape.tp * d, key=p)
        self.mp_comm = world.Split(color=d, key=t + shape.tp * p)
        ends = p in (0, shape.pp - 1)
        self.embed_comm = world.Split(color=(t + shape.tp * d) if ends else MPI.UNDEFINED,
                                      key=p)

    @property
    def tp(self) -> int:
        return self.shape.tp

    @property
    def dp(self) -> int:
        return self.shape.dp

    @property
    def pp(self) -> int:
        return self.shape.pp

    @property
    def first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def last_stage(self) -> bool:
        return self.pp_rank == self.shape.pp - 1

    def free(self) -> None:
        """Release the sub-communicators."""
        for c in (self.tp_comm, self.dp_comm, self.pp_comm, self.mp_comm, self.embed_comm):
            if c != MPI.COMM_NULL:
                c.Free()

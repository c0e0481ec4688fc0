"""The TP x DP process grid: sub-communicators and ring neighbours.

Ranks are laid out tensor-parallel fastest (Megatron order "tp-dp"). Worked example, 8 ranks,
tp=4, dp=2:

    rank:      0  1  2  3  4  5  6  7
    tp_rank:   0  1  2  3  0  1  2  3
    dp_rank:   0  0  0  0  1  1  1  1
    TP groups: [0, 1, 2, 3], [4, 5, 6, 7]      (ring 0->1->2->3->0, one node's GPUs)
    DP groups: [0, 4], [1, 5], [2, 6], [3, 7]  (same shard of the weights, different data)
"""
from __future__ import annotations

from dataclasses import dataclass

from mpi4py import MPI


@dataclass(frozen=True)
class GridShape:
    """tp x dp must equal the world size."""

    tp: int
    dp: int

    def __post_init__(self) -> None:
        for name, v in (("parallel.tp", self.tp), ("parallel.dp", self.dp)):
            if v < 1:
                raise ValueError(f"{name}={v} must be >= 1")

    @property
    def size(self) -> int:
        return self.tp * self.dp

    def coords(self, rank: int) -> tuple[int, int]:
        """(tp_rank, dp_rank) of a world rank."""
        return rank % self.tp, rank // self.tp


class ProcessGrid:
    """World communicator split into TP and DP groups (communicators passed, never global)."""

    def __init__(self, world: MPI.Comm, shape: GridShape) -> None:
        if world.Get_size() != shape.size:
            raise ValueError(f"parallel.tp*parallel.dp = {shape.tp}*{shape.dp} = {shape.size} "
                             f"but the job has {world.Get_size()} ranks; choose tp*dp = "
                             f"{world.Get_size()}")
        self.world = world
        self.shape = shape
        self.rank = world.Get_rank()
        self.tp_rank, self.dp_rank = shape.coords(self.rank)
        self.tp_comm = world.Split(color=self.dp_rank, key=self.tp_rank)
        self.dp_comm = world.Split(color=self.tp_rank, key=self.dp_rank)

    @property
    def tp(self) -> int:
        return self.shape.tp

    @property
    def dp(self) -> int:
        return self.shape.dp

    def free(self) -> None:
        """Release the sub-communicators."""
        for c in (self.tp_comm, self.dp_comm):
            if c != MPI.COMM_NULL:
                c.Free()

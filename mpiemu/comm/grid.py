"""The TP x CP x DP x PP process grid: sub-communicators for each group.

Ranks are laid out tensor-parallel fastest, then context-parallel, data-parallel, pipeline
(Megatron-Core's default order "tp-cp-dp-pp", megatron/core/parallel_state.py
`RankGenerator`): rank = tp_rank + tp (cp_rank + cp (dp_rank + dp pp_rank)). Worked example,
8 ranks, tp=2, dp=2, pp=2 (cp=1):

    rank:       0  1  2  3  4  5  6  7
    tp_rank:    0  1  0  1  0  1  0  1
    dp_rank:    0  0  1  1  0  0  1  1
    pp_rank:    0  0  0  0  1  1  1  1
    TP groups:        [0, 1], [2, 3], [4, 5], [6, 7]   (one node's GPUs: the fast links)
    DP groups:        [0, 2], [1, 3], [4, 6], [5, 7]   (same weights, different data)
    PP groups:        [0, 4], [1, 5], [2, 6], [3, 7]   (stage 0 -> stage 1)
    embedding groups: [0, 4], [1, 5], [2, 6], [3, 7]   (first and last stage: tied wte)
    model-parallel:   [0, 1, 4, 5], [2, 3, 6, 7]       (one replica: the gradient norm)

With cp = 2 (tp=2, dp=1, pp=1: ranks 0..3) the CP groups are [0, 2] and [1, 3] (the same TP
rank of each sequence chunk pair), and gradients are reduced over DP x CP (`dp_cp_comm`,
Megatron-Core's intra_dp_cp_group). With pp = 1 the embedding group is the rank alone.

Folded (`comm.folded`, timing only): the job has one MPI rank per class of exact images
(`comm.shape.Fold`), playing the class's representative; a group whose members are all
representatives is a plain MPI communicator, any other a `FoldedComm` that mirrors the
messages of images and sends real ones to the other classes' processes; the model-parallel
and world groups are mixed (scalar reductions only).
"""
from __future__ import annotations

from typing import Any, Callable

from mpi4py import MPI

from .folded import FoldedComm, group_comm
from .shape import Fold, GridShape


class ProcessGrid:
    """World communicator split into TP, DP, PP, embedding and model-parallel groups
    (communicators passed, never global)."""

    def __init__(self, world: MPI.Comm, shape: GridShape, fold: Fold | None = None
                 ) -> None:
        self.world = world
        self.shape = shape
        self.fold = fold
        if fold is not None:
            self._folded(world, shape, fold)
            return
        if world.Get_size() != shape.size:
            raise ValueError(f"parallel.tp*parallel.cp*parallel.dp*parallel.pp = {shape.tp}*"
                             f"{shape.cp}*{shape.dp}*{shape.pp} = {shape.size} but the job "
                             f"has {world.Get_size()} ranks")
        self.rank = world.Get_rank()
        self.tp_rank, self.dp_rank, self.pp_rank = shape.coords(self.rank)
        self.cp_rank = shape.cp_rank(self.rank)
        t, c, d, p = self.tp_rank, self.cp_rank, self.dp_rank, self.pp_rank
        tp, cp, dp = shape.tp, shape.cp, shape.dp
        self.tp_comm: Any = world.Split(color=c + cp * (d + dp * p), key=t)
        self.cp_comm: Any = world.Split(color=t + tp * (d + dp * p), key=c)
        self.dp_comm: Any = world.Split(color=t + tp * (c + cp * p), key=d)
        # gradients are reduced over DP x CP (Megatron-Core's intra_dp_cp_group)
        self.dp_cp_comm: Any = world.Split(color=t + tp * p, key=c + cp * d) if cp > 1 \
            else self.dp_comm
        self.pp_comm = world.Split(color=t + tp * (c + cp * d), key=p)
        self.mp_comm: Any = world.Split(color=c + cp * d, key=t + tp * p)
        # FP8 amaxes are reduced over TP x DP x CP, a stage's ranks (Megatron-Core's
        # amax reduction group)
        self.amax_comm: Any = world.Split(color=p, key=t + tp * (c + cp * d))
        self._experts(world, shape)
        self.world_comm: Any = world
        self.world_map = list(range(shape.size))    # device of each MPI world rank
        self._embed(world, t + tp * (c + cp * d))

    def _experts(self, world: MPI.Comm, shape: GridShape) -> None:
        """Expert parallelism (Megatron-Core's MoE parallel folding): the expert-TP group
        (ranks splitting each expert's FFN), the EP group (ranks splitting the experts), both
        together (`etp_ep`: the all-gather dispatcher's and the routed counts' group) and the
        expert-DP group (ranks holding the same expert slices), which reduces the experts'
        gradients. Expert DP is the DP x CP group when etp x ep equals TP, the TP group
        without EP, ETP and DP x CP."""
        self.etp_rank, self.ep_rank, self.edp_rank = shape.expert_place(self.rank)
        j, e, k = self.etp_rank, self.ep_rank, self.edp_rank
        base, em = self.pp_rank * shape.tp * shape.cp * shape.dp, shape.etp * shape.ep
        self.ep_comm: Any = None
        self.etp_comm: Any = None
        if shape.ep > 1:
            self.ep_comm = world.Split(color=base + j + shape.etp * k, key=e)
        if shape.etp > 1:
            self.etp_comm = world.Split(color=base + e + shape.ep * k, key=j)
        self.etp_ep_comm: Any = self.ep_comm if shape.etp == 1 else \
            world.Split(color=base + k, key=j + shape.etp * e)
        self.edp_comm: Any = self.dp_cp_comm
        if em == shape.tp:
            return
        if em == 1 and shape.cp * shape.dp == 1:
            self.edp_comm = self.tp_comm
            return
        self.edp_comm = world.Split(color=base + j + shape.etp * e, key=k)

    def _embed(self, world: MPI.Comm, color: int) -> None:
        ends = self.pp_rank in (0, self.shape.pp - 1)
        self.embed_comm = world.Split(color=color if ends else MPI.UNDEFINED,
                                      key=self.pp_rank)

    def _folded(self, world: MPI.Comm, shape: GridShape, fold: Fold) -> None:
        """One MPI rank per class of images (`Fold`), playing its representative: each
        group a plain communicator where its members are all representatives, else a
        `FoldedComm` (`comm.folded.group_comm`); model-parallel and world groups mixed."""
        self.rank = fold.rep(world.Get_rank())
        self.tp_rank, self.dp_rank, self.pp_rank = shape.coords(self.rank)
        self.cp_rank = shape.cp_rank(self.rank)
        self.etp_rank, self.ep_rank, self.edp_rank = shape.expert_place(self.rank)
        members = shape.groups(self.rank)

        def group(name: str, mixed: bool = False) -> Any:
            return group_comm(world, name.replace("_", " x "), members[name], self.rank,
                              fold.proc, fold.rep, mixed)
        self.tp_comm, self.dp_comm = group("tp"), group("dp")
        self.cp_comm = group("cp") if shape.cp > 1 else self.dp_comm
        self.dp_cp_comm = group("dp_cp") if shape.cp > 1 else self.dp_comm
        self.pp_comm = group("pp")
        self.mp_comm = group("mp", mixed=True)
        self.amax_comm = None               # FP8 numerics never fold
        self.world_comm = FoldedComm("world", self.rank, range(shape.size),
                                     [fold.proc(r) for r in range(shape.size)], world,
                                     mixed=True)
        self.world_map = [fold.rep(k) for k in range(world.Get_size())]
        t, c, d = self.tp_rank, self.cp_rank, self.dp_rank
        self._embed(world, t + shape.tp * (c + shape.cp * d))
        self.ep_comm = group("ep") if shape.ep > 1 else None
        self.etp_comm = group("etp") if shape.etp > 1 else None
        self.etp_ep_comm = group("etp_ep") if shape.etp > 1 else self.ep_comm
        self.edp_comm = self._folded_edp(members, group)

    def _folded_edp(self, members: dict[str, list[int]], group: Callable[[str], Any]
                    ) -> Any:
        """The expert-DP group: one of the groups already built where it has their
        members (as `_experts` shares them), else its own."""
        for name, comm in (("dp_cp", self.dp_cp_comm), ("tp", self.tp_comm)):
            if members["edp"] == members[name]:
                return comm
        return group("edp")

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
    def cp(self) -> int:
        return self.shape.cp

    @property
    def first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def last_stage(self) -> bool:
        return self.pp_rank == self.shape.pp - 1

    def free(self) -> None:
        """Release the sub-communicators."""
        groups = [self.tp_comm, self.dp_comm, self.pp_comm, self.mp_comm, self.embed_comm]
        if self.cp > 1:
            groups += [self.cp_comm, self.dp_cp_comm]
        groups += [c for c in (self.ep_comm, self.etp_comm) if c is not None]
        if self.etp_comm is not None:
            groups += [self.etp_ep_comm]
        if self.edp_comm not in (self.dp_cp_comm, self.tp_comm):
            groups += [self.edp_comm]
        for c in groups:
            if c != MPI.COMM_NULL:
                c.Free()

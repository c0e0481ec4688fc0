"""Folding with context parallelism: one MPI rank per class of images (CP ranks apart) gives
every emulated rank the unfolded run's times, bytes, peers, names and routes bit for bit;
a `FoldedComm` whose members are played by other processes pairs messages by offset, with
and without MPI."""
from __future__ import annotations

from collections import defaultdict, deque
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

from mpiemu.analysis import load
from mpiemu.analysis.unfold import timeline_differences
from mpiemu.comm.folded import FoldError, FoldedComm
from mpiemu.comm.shape import Fold, GridShape
from mpiemu.config.errors import ConfigError
from mpiemu.runner.fold_plan import classes, plan_fold
from mpiemu.runner.job import validate
from tests.conftest import run_mpi

WORKLOAD = "workloads/pipeline-small.toml"
LLAMA = ["run.kind='train'", "run.numerics='off'", "train.check_reference=false",
         "run.iterations=2", "model.preset='tiny-llama'", "model.attention='flash'",
         "model.layers=2", "parallel.sequence_parallel=false"]


def zero(stage: int) -> str:
    return f"optimizer.zero={stage}"


def grid(tp: int, cp: int, dp: int, pp: int) -> list[str]:
    return [f"parallel.tp={tp}", f"parallel.cp={cp}", f"parallel.dp={dp}", f"parallel.pp={pp}"]


H100_NVLS = ["device.preset='h100-sxm5'", "network.preset='dgx-h100'",
             "collectives.algorithm='nvls'"]
RAILS = ["network.preset='dgx-a100'", "network.devices_per_node=2"]
FOUR = ["network.preset='dgx-a100'", "network.devices_per_node=4"]
# (name, grid (tp, cp, dp, pp), more settings): unfolded tp*cp*dp*pp ranks vs one per class
CASES = [
    ("cp2-dp2-ring", (1, 2, 2, 1), [zero(0)]),
    ("cp2-dp2-allgather-zero1", (1, 2, 2, 1), ["parallel.cp_comm='all_gather'", zero(1)]),
    ("cp2-tp2-dp2-sp-zero1", (2, 2, 2, 1), ["parallel.sequence_parallel=true",
                                            "model.kv_heads=1", zero(1)]),
    ("cp2-dp2-pp2-allgather-zero3", (1, 2, 2, 2), ["parallel.cp_comm='all_gather'",
                                                   zero(3)]),
    ("cp4-dp2-ring-zero1", (1, 4, 2, 1), [zero(1)]),
    ("cp2-tp2-pp2", (2, 2, 1, 2), [zero(0)]),                      # DP x CP all real
    ("cp2-dp2-rails-zero1", (1, 2, 2, 1), [*RAILS, zero(1)]),      # across nodes, rail rings
    ("cp2-dp2-nvls", (1, 2, 2, 1), [*H100_NVLS, zero(0)]),
    # two DP x CP members per node, two nodes: DP in 2 classes, rail rings pair members
    # three apart (1 -> 0 -> 3 -> 2)
    ("cp2-dp4-two-per-node-zero1", (1, 2, 4, 1), [*FOUR, zero(1)]),
]


def sets(*extra: str) -> list[str]:
    return [a for s in [*LLAMA, *extra] for a in ("--set", s)]


def run(tmp: Path, n: int, extra: list[str]) -> Path:
    res = run_mpi(n, ["run", WORKLOAD, *sets(*extra), "--out", str(tmp)])
    assert res.returncode == 0, res.stderr
    return tmp


@pytest.mark.parametrize("name, shape, extra", CASES, ids=[c[0] for c in CASES])
def test_folded_cp_run_equals_the_unfolded_run_per_emulated_rank(
        tmp_path: Path, name: str, shape: tuple[int, int, int, int], extra: list[str]
        ) -> None:
    tp, cp, dp, pp = shape
    s = GridShape(tp, dp, pp, cp)
    fold = classes(validate(WORKLOAD, [*LLAMA, *grid(*shape), *extra], s.size))[0]
    assert fold.launch < s.size
    full = load(run(tmp_path / "full", s.size, [*grid(*shape), *extra])).ranks
    folded_dir = run(tmp_path / "folded", fold.launch, [*grid(*shape), *extra])
    reps = load(folded_dir, expand=False)
    assert [r.rank for r in reps.ranks] == sorted(fold.rep(m) for m in range(fold.launch))
    # the representatives' own traces are the unfolded ranks', everything included
    assert timeline_differences([full[r.rank] for r in reps.ranks], reps.ranks) == []
    folded = load(folded_dir).ranks
    assert [r.rank for r in folded] == list(range(s.size))
    assert timeline_differences(full, folded) == []


def test_a_cp_fold_is_planned_and_refused_by_its_launch_size() -> None:
    base = [*LLAMA, *grid(1, 2, 2, 2), zero(1)]
    w = validate(WORKLOAD, base, 4)
    assert plan_fold(w, 8) is None
    assert plan_fold(w, 4) == Fold(GridShape(1, 2, 2, 2))
    with pytest.raises(ConfigError, match=r"a job of 4 ranks \(one per \(CP rank, stage\)\)"):
        validate(WORKLOAD, [*base, "run.fold='on'"], 2)
    with pytest.raises(ConfigError, match=r"or 4 \(one per \(CP rank, stage\)\)"):
        validate(WORKLOAD, base, 2)
    with pytest.raises(ConfigError, match=r"or 4 \(2 per \(CP rank, stage\), its TP x DP "
                       r"ranks in 1 x 2 classes") as exc:
        validate(WORKLOAD, [*LLAMA, *grid(1, 2, 4, 1), *FOUR, zero(1)], 2)
    assert "\n" not in str(exc.value)


def test_a_tree_over_dp_x_cp_across_nodes_keeps_dp_ranks_apart() -> None:
    """NCCL may pick its tree for a plain all-reduce across nodes: the DP x CP members play
    different roles, so no two are images, and there is nothing left to fold."""
    with pytest.raises(ConfigError, match="no two emulated GPUs are exact images.*tree"):
        validate(WORKLOAD, [*LLAMA, *grid(1, 2, 2, 1), *RAILS, zero(0)], 2)
    fold = classes(validate(WORKLOAD, [*LLAMA, *grid(2, 2, 2, 1), *FOUR, zero(0)], 8))[0]
    assert (fold.tp_classes, fold.dp_classes, fold.launch) == (1, 2, 4)   # TP still folds


def test_studies_launch_one_process_per_cp_rank_and_stage() -> None:
    from mpiemu.studies.runs import processes
    assert processes(WORKLOAD, [*LLAMA, *grid(1, 2, 2, 2), zero(1)], 8) == 4


def test_cp_images_keep_cp_rank_and_stage() -> None:
    s = GridShape(2, 2, 2, 2)                  # tp, dp, pp, cp: 16 devices
    fold = Fold(s)
    assert fold.launch == 4
    assert [fold.rep(m) for m in range(4)] == [0, 2, 8, 10]
    assert fold.members(1) == [2, 3, 6, 7]      # (t, c=1, d, p=0)
    for g in (fold.shape.shifter(a, b) for a, b in fold.shifts()):
        assert sorted(g(x) for x in range(16)) == list(range(16))
        assert all(s.cp_rank(g(x)) == s.cp_rank(x) and g(x) // 8 == x // 8
                   for x in range(16))
    finer = Fold(s, 1, 2)                       # DP ranks apart: one process per (c, d, p)
    assert finer.launch == 8 and finer.members(1) == [2, 3]
    assert [finer.proc(x) for x in finer.members(5)] == [5, 5]


class Mailbox:
    """Real ranks of a fake communicator: `Isend` posts to the destination's box, `Irecv`
    takes the next message of (source, tag) at once (MPI's non-overtaking order)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.boxes: dict[tuple[int, int, int], deque[np.ndarray]] = defaultdict(deque)
        self.tags: list[tuple[int, int, int]] = []

    def comm(self, rank: int) -> Any:
        box = self

        class Fake:
            def Get_size(self) -> int:
                return box.size

            def Get_rank(self) -> int:
                return rank

            def Isend(self, buf: np.ndarray, dest: int, tag: int) -> MPI.Request:
                box.tags.append((rank, dest, tag))
                box.boxes[(rank, dest, tag)].append(np.array(buf, copy=True))
                return MPI.REQUEST_NULL

            def Irecv(self, buf: np.ndarray, source: int, tag: int) -> MPI.Request:
                buf[:] = box.boxes[(source, rank, tag)].popleft()
                return MPI.REQUEST_NULL
        return Fake()


def header(sender: int, offset: int, nbytes: float = 8.0) -> np.ndarray:
    return np.array([sender, offset, 0.0, 0.0, nbytes])


def interleaved(n: int, q: int, box: Mailbox) -> list[FoldedComm]:
    """A group of n whose member j is played by real rank j mod q (the DP x CP group: q CP
    ranks real, DP replicas images), one `FoldedComm` per real rank."""
    return [FoldedComm("dp x cp", c, range(n), [j % q for j in range(n)], box.comm(c))
            for c in range(q)]


@pytest.mark.parametrize("cp, dp, offsets", [(2, 2, (1, -1)), (3, 2, (1, -1, 2)),
                                             (2, 1, (1,)), (2, 4, (1, 3, -3))])
def test_folded_comm_pairs_each_receive_with_the_send_it_is_an_image_of(
        cp: int, dp: int, offsets: tuple[int, ...]) -> None:
    n, box = cp * dp, Mailbox(cp)
    ms = interleaved(n, cp, box)
    for c, m in enumerate(ms):                 # every member sends at every offset
        for k in offsets:
            m.Isend(header(c, k), (c + k) % n, 100)
    for c, m in enumerate(ms):
        for k in offsets:
            got = np.empty(5)
            source = (c - k) % n
            reqs, fill = m.receive(got, source, 100, 8.0)
            fill()
            # what the process playing the source sent at that offset (its image came here)
            assert got[:2].tolist() == [source % cp, k]
    real = {t for _, _, t in box.tags}         # each offset its own tag on real messages
    assert real == {100 * n + k % n for k in offsets if (k % n) % cp}


def test_folded_comm_checks_bytes_and_refuses_what_it_cannot_mirror() -> None:
    a, b = interleaved(4, 2, Mailbox(2))
    a.Isend(header(0, +1), 1, 100)
    got = np.empty(5)
    with pytest.raises(FoldError, match="does not divide"):
        b.receive(got, 0, 100, 16.0)[1]()
    with pytest.raises(FoldError, match="never sent"):
        a.receive(got, 2, 100, 8.0)[1]()      # an image of a: a sent nothing at offset 2
    with pytest.raises(FoldError, match="use `sub`"):
        a.Split(0, 0)


@pytest.mark.mpi(min_size=2)
def test_folded_comm_over_real_ranks_keeps_offsets_apart() -> None:
    world = MPI.COMM_WORLD
    q, c = world.Get_size(), world.Get_rank()
    n = 2 * q                                   # cp = q real ranks, dp = 2
    m = FoldedComm("dp x cp", c, range(n), [j % q for j in range(n)], world.Dup())
    try:
        sends = [m.Isend(header(c, +1), (c + 1) % n, 7),
                 m.Isend(header(c, -1), (c - 1) % n, 7)]
        got = {d: np.empty(5) for d in (+1, -1)}
        posted = [m.receive(got[+1], (c - 1) % n, 7, 8.0),
                  m.receive(got[-1], (c + 1) % n, 7, 8.0)]
        MPI.Request.Waitall([r for reqs, _ in posted for r in reqs] + sends)
        for _, fill in posted:
            fill()
        assert got[+1][:2].tolist() == [(c - 1) % q, +1]
        assert got[-1][:2].tolist() == [(c + 1) % q, -1]
        assert m.allreduce(c) == q - 1
        mine = m.sub([j for j in range(n) if j % q == c])     # this rank and its image
        assert mine.size == 2 and mine.procs == [0, 0] and mine.allreduce(c) == c
        mine.Free()
    finally:
        m.Free()

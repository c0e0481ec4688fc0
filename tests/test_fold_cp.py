"""Folding with context parallelism: one MPI rank per (CP rank, pipeline stage) gives every
emulated rank the unfolded run's times, bytes, peers, names and routes bit for bit; the
DP x CP group's `RingMirror` pairs messages by ring direction, with and without MPI."""
from __future__ import annotations

from collections import defaultdict, deque
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

from mpiemu.analysis import load
from mpiemu.analysis.unfold import timeline_differences
from mpiemu.comm.mirror import FoldError, Mirror, RingMirror
from mpiemu.comm.shape import Fold, GridShape
from mpiemu.config.errors import ConfigError
from mpiemu.runner.fold_plan import plan_fold
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
# (name, grid (tp, cp, dp, pp), more settings): unfolded tp*cp*dp*pp ranks vs folded cp*pp
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
    full = load(run(tmp_path / "full", s.size, [*grid(*shape), *extra])).ranks
    folded_dir = run(tmp_path / "folded", cp * pp, [*grid(*shape), *extra])
    reps = load(folded_dir, expand=False)
    fold = Fold(s)
    assert [r.rank for r in reps.ranks] == sorted(fold.rep(m) for m in range(cp * pp))
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
    with pytest.raises(ConfigError, match=r"a job of parallel.cp\*parallel.pp = 2\*2 = 4 "
                       r"ranks \(one per context-parallel rank of each pipeline stage\)"):
        validate(WORKLOAD, [*base, "run.fold='on'"], 2)
    with pytest.raises(ConfigError, match=r"or 4 \(one per context-parallel rank"):
        validate(WORKLOAD, base, 2)
    with pytest.raises(ConfigError, match="stage 0, CP rank 0: the route") as exc:
        validate(WORKLOAD, [*LLAMA, *grid(1, 2, 4, 1), "network.preset='dgx-a100'",
                            "network.devices_per_node=4", zero(1)], 2)
    assert "\n" not in str(exc.value)


def test_cp_folds_refuse_a_tree_over_dp_x_cp_across_nodes() -> None:
    with pytest.raises(ConfigError, match="the DP x CP group spans nodes"):
        validate(WORKLOAD, [*LLAMA, *grid(1, 2, 2, 1), *RAILS, zero(0)], 2)


def test_cp_folds_refuse_rail_rings_that_pair_far_members() -> None:
    """Two DP x CP members per node: the second rail's ring goes 1 -> 0 -> 3, which the
    folded form's ring mirror (offsets +1 and -1) cannot pair."""
    rails = [*LLAMA, "network.preset='dgx-a100'", "network.devices_per_node=4", zero(1)]
    with pytest.raises(ConfigError, match="pair members more than one apart") as exc:
        validate(WORKLOAD, [*rails, *grid(2, 2, 4, 1)], 2)
    assert "\n" not in str(exc.value)
    assert plan_fold(validate(WORKLOAD, [*rails, *grid(2, 2, 2, 1)], 2), 2) is not None


def test_studies_launch_one_process_per_cp_rank_and_stage() -> None:
    from mpiemu.studies.runs import processes
    assert processes(WORKLOAD, [*LLAMA, *grid(1, 2, 2, 2), zero(1)], 8) == 4


def test_cp_images_keep_cp_rank_and_stage() -> None:
    s = GridShape(2, 2, 2, 2)                  # tp, dp, pp, cp: 16 devices
    fold = Fold(s)
    assert fold.launch == 4
    assert [fold.place(m) for m in range(4)] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert [fold.rep(m) for m in range(4)] == [0, 2, 8, 10]
    assert fold.members(1) == [2, 3, 6, 7]      # (t, c=1, d, p=0)
    for g in fold.images():
        assert sorted(g(x) for x in range(16)) == list(range(16))
        assert all(s.cp_rank(g(x)) == s.cp_rank(x) and g(x) // 8 == x // 8
                   for x in range(16))


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


def header(sender: int, direction: int, nbytes: float = 8.0) -> np.ndarray:
    return np.array([sender, direction, 0.0, 0.0, nbytes])


@pytest.mark.parametrize("cp, dp", [(2, 2), (3, 2), (2, 1)])
def test_ring_mirror_pairs_each_receive_with_the_send_it_is_an_image_of(cp: int, dp: int
                                                                        ) -> None:
    n, box = cp * dp, Mailbox(cp)
    ms = [RingMirror("dp x cp", n, c, range(n), box.comm(c)) for c in range(cp)]
    for c, m in enumerate(ms):                 # every member sends both ways round the ring
        m.Isend(header(c, +1), (c + 1) % n, 100)
        m.Isend(header(c, -1), (c - 1) % n, 100)
    for c, m in enumerate(ms):
        for source, direction in (((c - 1) % n, +1), ((c + 1) % n, -1)):
            got = np.empty(5)
            reqs, fill = m.receive(got, source, 100, 8.0)
            fill()
            # what the real rank playing the source sent the same way (its image came here)
            assert got[:2].tolist() == [source % cp, direction]
    # one real tag per direction (a group of two has one direction)
    assert {t for _, _, t in box.tags} == ({200} if n == 2 else {200, 201})


def test_ring_mirror_refuses_what_is_not_a_ring_and_checks_bytes() -> None:
    box = Mailbox(2)
    a, b = (RingMirror("dp x cp", 4, c, range(4), box.comm(c)) for c in range(2))
    with pytest.raises(FoldError, match="member 2 ahead, where only rings are exact"):
        a.Isend(header(0, 2), 2, 100)
    a.Isend(header(0, +1), 1, 100)
    got = np.empty(5)
    with pytest.raises(FoldError, match="does not divide"):
        b.receive(got, 0, 100, 16.0)[1]()
    with pytest.raises(ValueError, match="not played by real rank"):
        RingMirror("dp x cp", 4, 1, range(4), box.comm(0))


def test_ring_mirror_of_one_real_rank_is_the_plain_mirror() -> None:
    m = RingMirror("dp", 4, 0, range(4), Mailbox(1).comm(0))
    plain = Mirror("dp", 4, 0, range(4))
    for mirror in (m, plain):
        mirror.Isend(header(0, +1), 1, 100)
        got = np.empty(5)
        reqs, fill = mirror.receive(got, 3, 100, 8.0)
        fill()
        assert reqs == [] and got.tolist() == header(0, +1).tolist()


@pytest.mark.mpi(min_size=2)
def test_ring_mirror_over_real_ranks_separates_the_two_directions() -> None:
    world = MPI.COMM_WORLD
    q, c = world.Get_size(), world.Get_rank()
    n = 2 * q                                   # cp = q real ranks, dp = 2
    m = RingMirror("dp x cp", n, c, range(n), world.Dup())
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
    finally:
        m.Free()

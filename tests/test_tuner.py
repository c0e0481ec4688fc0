"""NCCL's tuner (comm/tuner.py) and the tree's lanes (comm/tree.py), without MPI."""
from __future__ import annotations

import pytest

from mpiemu.comm.tree import roles
from mpiemu.comm.tuner import Choice, candidates, pick, predicted_s
from mpiemu.net import load_network

MiB, GiB = 1 << 20, 1 << 30


def _best(spec, op: str, nbytes: float, n: int, nodes: int, algos: list[str]) -> Choice:
    return pick(spec, op, nbytes, n, nodes, candidates(algos, spec.protocols))


def test_predicted_times_are_nccls_worked_example_on_a_dgx_a100() -> None:
    """docs/nccl_model.md 5.4: NCCL v2.21.5's model of an 8-GPU ring all-reduce on one
    DGX A100 (lat + nBytes / algBw, every number from tuning.cc)."""
    spec = load_network("dgx-a100")
    want = {(MiB, "ll"): 35.9, (MiB, "ll128"): 48.9, (MiB, "simple"): 63.6,
            (GiB, "ll128"): 8550.8, (GiB, "simple"): 7885.4}
    for (size, proto), us in want.items():
        got = predicted_s(spec, "all_reduce", size, 8, 1, Choice("ring", proto)) * 1e6
        assert got == pytest.approx(us, abs=0.06), (size, proto)
    assert _best(spec, "all_reduce", MiB, 8, 1, ["ring"]) == Choice("ring", "ll")
    assert _best(spec, "all_reduce", GiB, 8, 1, ["ring"]) == Choice("ring", "simple")


def test_on_two_nodes_nccls_model_keeps_the_ring_for_large_all_reduces() -> None:
    """tuning.cc:174 counts ring and tree at bwIntra on up to two nodes, and the tree's
    algBw is busBw x 0.92 / 2 against the ring's n / (2(n-1)): the ring wins large calls,
    the tree (lower latency) small ones."""
    spec = load_network("dgx-a100")
    assert _best(spec, "all_reduce", GiB, 16, 2, ["ring", "tree"]).algorithm == "ring"
    assert _best(spec, "all_reduce", 64 << 10, 16, 2, ["ring", "tree"]).algorithm == "tree"


def test_nvls_wins_large_all_reduces_on_an_h100_node() -> None:
    spec = load_network("dgx-h100")
    assert _best(spec, "all_reduce", GiB, 8, 1, ["ring", "nvls"]) == Choice("nvls", "simple")
    assert _best(spec, "all_reduce", 4 << 10, 8, 1, ["ring", "nvls"]) == Choice("ring", "ll")


@pytest.mark.parametrize("nodes,g", [(2, 1), (2, 4), (3, 2), (5, 3)])
def test_tree_lanes_use_every_nic_and_span_every_rank(nodes: int, g: int) -> None:
    """Two trees per lane, one lane per device of a node: every device heads (crosses nodes
    through its NIC in) one tree A and one tree B, and each tree reaches every rank once."""
    groups = [list(range(i * g, (i + 1) * g)) for i in range(nodes)]
    ranks = [r for grp in groups for r in grp]
    by_rank = {r: roles(groups, r) for r in ranks}
    trees = {role.tree for rs in by_rank.values() for role in rs}
    assert trees == set(range(2 * g))
    for t in trees:
        role = {r: next(x for x in by_rank[r] if x.tree == t) for r in ranks}
        assert sum(x.up_to < 0 for x in role.values()) == 1          # one root
        for r, x in role.items():                                     # edges agree
            assert all(role[c].up_to == r for c in x.up_from)
            if x.up_to >= 0:
                assert r in role[x.up_to].up_from
    if nodes > 1 and g > 1:
        for r in ranks:                  # a head: its parent or a child is on another node
            heads = [x for x in by_rank[r]
                     if any(c // g != r // g for c in (*x.up_from, x.up_to) if c >= 0)]
            assert sorted(x.tree % 2 for x in heads) == [0, 1], r


def test_nvls_tree_wins_large_all_reduces_across_h100_nodes() -> None:
    """tuning.cc:176, 216: NVLS Tree's algBw min(bwIntra, bwInter) x 5/6 (300 GB/s on two
    DGX H100) against the ring's 360 x 16/30 = 192: NCCL runs it for large calls."""
    spec = load_network("dgx-h100")
    algos = ["ring", "tree", "nvls_tree"]
    assert _best(spec, "all_reduce", GiB, 16, 2, algos) == Choice("nvls_tree", "simple")
    assert _best(spec, "all_reduce", 4 << 10, 16, 2, algos).algorithm != "nvls_tree"

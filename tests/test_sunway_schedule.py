"""SwFormer inter-op scheduling (intra, OPT2, KA) and its placement on a Sunway timeline."""
from __future__ import annotations

import pytest

from mpiemu.devices import load_device, device_cost
from mpiemu.devices.sunway import AttnShape
from mpiemu.devices.sunway.layer import LayerShape, layer_ops
from mpiemu.devices.sunway.schedule import Op, Option, Schedule, schedule
from mpiemu.executors.sunway import charge_attention, charge_schedule
from mpiemu.sim.timeline import Timeline


def gemm(name: str, tiles: int, t: float, deps: tuple[str, ...] = (),
         alt: tuple[int, float] | None = None) -> Op:
    opts = [Option(f"{tiles}", (t,) * tiles)]
    if alt:
        opts.append(Option(f"{alt[0]}", (alt[1],) * alt[0]))
    return Op(name, "gemm", tuple(opts), deps)


def no_overlap_per_cg(s: Schedule) -> bool:
    by: dict[int, list[tuple[float, float]]] = {}
    for seg in s.segments:
        by.setdefault(seg.cg, []).append((seg.start, seg.end))
    return all(b[0] >= a[1] - 1e-15 for spans in by.values()
               for a, b in zip(sorted(spans), sorted(spans)[1:]))


def test_intra_op_runs_each_op_alone_in_waves() -> None:
    ops = [gemm("a", 8, 1.0), gemm("b", 8, 1.0, ("a",))]
    s = schedule(ops, 6, "intra")
    assert s.makespan == pytest.approx(4.0)               # two waves each, tails idle
    assert [p.cgs for p in s.placements] == [tuple(range(6))] * 2
    assert no_overlap_per_cg(s)


def test_opt2_lets_two_independent_gemms_fill_each_others_tails() -> None:
    ops = [gemm("x", 8, 1.0), gemm("w", 4, 1.0, alt=(8, 0.5))]
    intra, opt2 = schedule(ops, 6, "intra"), schedule(ops, 6, "opt2")
    assert intra.makespan == pytest.approx(3.0)
    assert opt2.makespan == pytest.approx(2.0)            # 12 tile-units on 6 CGs
    assert {p.group for p in opt2.placements} == {0} and no_overlap_per_cg(opt2)


def test_opt2_never_pairs_dependent_gemms() -> None:
    ops = [gemm("x", 8, 1.0), gemm("y", 4, 1.0, ("x",))]
    assert schedule(ops, 6, "opt2").makespan == schedule(ops, 6, "intra").makespan


def test_ka_fills_attentions_idle_cgs_with_an_independent_op_found_by_bfs() -> None:
    attn = Op("attn", "attention", (Option("heads", (3.0,) * 4),), ("pre",))
    ops = [gemm("pre", 6, 1.0), gemm("w", 2, 1.0, ("pre",)), attn,
           gemm("post", 6, 1.0, ("attn",))]
    intra, ka = schedule(ops, 6, "intra"), schedule(ops, 6, "ka")
    assert intra.makespan == pytest.approx(6.0)
    assert ka.makespan == pytest.approx(5.0)              # w runs on the 2 idle CGs
    w = next(p for p in ka.placements if p.op == "w")
    a = next(p for p in ka.placements if p.op == "attn")
    assert w.group == a.group and set(w.cgs).isdisjoint(a.cgs)


def test_ka_never_moves_an_op_that_depends_on_attention() -> None:
    attn = Op("attn", "attention", (Option("heads", (3.0,) * 4),))
    ops = [attn, gemm("post", 2, 1.0, ("attn",))]
    ka = schedule(ops, 6, "ka")
    assert ka.makespan == pytest.approx(4.0)
    assert [p.group for p in ka.placements] == [0, 1]


def test_bad_policy_and_bad_order_are_refused() -> None:
    with pytest.raises(ValueError, match="policy"):
        schedule([gemm("a", 1, 1.0)], 6, "greedy")
    with pytest.raises(ValueError, match="not earlier"):
        schedule([gemm("b", 1, 1.0, ("a",)), gemm("a", 1, 1.0)], 6)


@pytest.fixture(scope="module")
def gpt3_bwd() -> list[Op]:
    m = device_cost(load_device("sw26010pro"))
    shape = LayerShape(hidden=4096, heads=32, head_dim=128, ffn=16384, seq=2048, batch=4, tp=8)
    return layer_ops(m, shape, "bwd")


def test_ka_on_gpt3_backward_runs_w_gemms_beside_attention(gpt3_bwd: list[Op]) -> None:
    ka, intra = schedule(gpt3_bwd, 6, "ka"), schedule(gpt3_bwd, 6, "intra")
    attn = next(p for p in ka.placements if p.op == "attn.b")
    beside = {p.op for p in ka.placements if p.group == attn.group} - {"attn.b"}
    assert beside and all(op.endswith(".w") for op in beside)
    assert ka.makespan < intra.makespan and no_overlap_per_cg(ka)


def test_charged_schedule_names_each_ops_cgs_on_the_timeline(gpt3_bwd: list[Op]) -> None:
    tl = Timeline(None)
    s = schedule(gpt3_bwd, 6, "ka")
    end = charge_schedule(tl, s, 1.0)
    assert end == pytest.approx(1.0 + s.makespan)
    assert all(tl.free_at(f"cg{c}") <= end + 1e-12 for c in range(6))
    assert tl.free_at("compute") == pytest.approx(end)


def test_charged_attention_advances_the_cgs_its_heads_ran_on() -> None:
    m = device_cost(load_device("sw26010pro"))
    tl = Timeline(None)
    end = charge_attention(tl, m, "attn", AttnShape(1, 4, 1024, 128), "fwd", 0.0)
    assert [tl.free_at(f"cg{c}") > 0 for c in range(6)] == [True] * 4 + [False] * 2
    assert end == pytest.approx(tl.free_at("compute"))

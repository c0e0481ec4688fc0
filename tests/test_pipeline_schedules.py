"""Pipeline schedules: Megatron-LM's orders, the textbook bubble, activations in flight."""
from __future__ import annotations

import pytest

from mpiemu.model.pipeline_schedules import bubble_fraction, in_flight, order, simulate


def names(schedule: str, p: int, s: int, m: int, v: int = 1) -> list[str]:
    return [str(x) for x in order(schedule, p, s, m, v)]


def test_1f1b_orders_are_megatrons() -> None:
    """forward_backward_pipelining_without_interleaving: p - s - 1 warm-up forwards, then
    one forward / one backward, then the cool-down backwards (p = 4, m = 6)."""
    assert names("1f1b", 4, 0, 6) == ["F0", "F1", "F2", "F3", "B0", "F4", "B1", "F5", "B2",
                                      "B3", "B4", "B5"]
    assert names("1f1b", 4, 1, 6) == ["F0", "F1", "F2", "B0", "F3", "B1", "F4", "B2", "F5",
                                      "B3", "B4", "B5"]
    assert names("1f1b", 4, 3, 6) == ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3", "F4",
                                      "B4", "F5", "B5"]
    assert names("1f1b", 4, 0, 2) == ["F0", "F1", "B0", "B1"]     # warm-up capped at m


def test_interleaved_orders_are_megatrons() -> None:
    """forward_backward_pipelining_with_interleaving, p = 2, m = 4, v = 2, worked by hand
    from its get_model_chunk_id and warm-up count: stage 0 warms up with
    (p - 0 - 1) * 2 + (v - 1) * p = 4 virtual micro-batches, stage 1 with 2; micro-batches
    go in groups of p per chunk; backward visits the chunks in reverse."""
    assert names("interleaved", 2, 0, 4, 2) == [
        "F0", "F1", "F0.1", "F1.1", "F2", "B0.1", "F3", "B1.1", "F2.1", "B0", "F3.1", "B1",
        "B2.1", "B3.1", "B2", "B3"]
    assert names("interleaved", 2, 1, 4, 2) == [
        "F0", "F1", "F0.1", "B0.1", "F1.1", "B1.1", "F2", "B0", "F3", "B1", "F2.1", "B2.1",
        "F3.1", "B3.1", "B2", "B3"]
    # m == p: every forward first (Megatron's all_warmup_microbatches)
    assert names("interleaved", 2, 1, 2, 2) == ["F0", "F1", "F0.1", "F1.1", "B0.1", "B1.1",
                                                "B0", "B1"]


def test_gpipe_runs_every_forward_first() -> None:
    assert names("gpipe", 3, 1, 3) == ["F0", "F1", "F2", "B0", "B1", "B2"]


@pytest.mark.parametrize("p, m", [(2, 4), (4, 4), (4, 8), (4, 32), (8, 16), (8, 64)])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_bubble_is_p_minus_1_over_m(schedule: str, p: int, m: int) -> None:
    """Narayanan et al. 2021 2.2.1: bubble / ideal = (p - 1) / m for uniform stages."""
    assert bubble_fraction(schedule, p, m, 1, 1.0, 2.0) == pytest.approx((p - 1) / m,
                                                                         abs=1e-9)


@pytest.mark.parametrize("p, m, v", [(2, 4, 2), (4, 8, 2), (4, 16, 4), (8, 16, 3),
                                     (4, 4, 2), (8, 64, 2)])
def test_interleaved_bubble_is_p_minus_1_over_v_m(p: int, m: int, v: int) -> None:
    """Narayanan et al. 2021 2.2.2: with v chunks of 1/v the work, (p - 1) / (v m)."""
    assert bubble_fraction("interleaved", p, m, v, 1.0 / v, 2.0 / v) == \
        pytest.approx((p - 1) / (v * m), abs=1e-9)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_1f1b_stage_i_keeps_p_minus_i_forwards_in_flight(p: int) -> None:
    m = 2 * p
    assert [in_flight(order("1f1b", p, s, m)) for s in range(p)] == [p - s for s in range(p)]
    assert all(in_flight(order("gpipe", p, s, m)) == m for s in range(p))


@pytest.mark.parametrize("schedule, v", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2),
                                         ("interleaved", 3)])
def test_every_pass_runs_once_and_no_schedule_deadlocks(schedule: str, v: int) -> None:
    p, m = 4, 8
    for s in range(p):
        passes = order(schedule, p, s, m, v)
        assert sorted((x.kind, x.micro, x.chunk) for x in passes) == sorted(
            (k, i, c) for k in "FB" for i in range(m) for c in range(v))
    assert len(simulate(schedule, p, m, v, 1.0, 2.0)) == p

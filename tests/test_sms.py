"""SMs shared between the compute stream and collective kernels (`sim.sms`): a GEMM runs on
the SMs a collective kernel leaves it, a fluid model exact per piece."""
from __future__ import annotations

import pytest

from mpiemu.devices import load_device, device_cost
from mpiemu.net import load_network
from mpiemu.sim import charge as ops
from mpiemu.sim.sms import SmShare
from mpiemu.sim.timeline import Timeline

FULL, SHARED = 10.0, 20.0             # a kernel alone, and while SMs are held


def shared(held: int) -> float:
    return SHARED * held / 4          # 4 SMs held: twice as long


def test_nothing_held_or_held_before_takes_the_full_time() -> None:
    sms = SmShare()
    assert sms.stretch(0.0, FULL, shared) == FULL
    sms.hold(0.0, 5.0, 4)
    assert sms.stretch(5.0, FULL, shared) == FULL
    assert sms.stretch(0.0, FULL, shared) == FULL     # forgotten: ended by the last start


def test_held_throughout_takes_the_shared_time() -> None:
    sms = SmShare()
    sms.hold(0.0, 100.0, 4)
    assert sms.stretch(1.0, FULL, shared) == pytest.approx(SHARED, abs=1e-12)


def test_held_for_part_runs_the_rest_at_the_full_rate() -> None:
    sms = SmShare()
    sms.hold(0.0, 6.0, 4)             # from t = 2: 4 s shared (a fifth of the work)
    assert sms.stretch(2.0, FULL, shared) == pytest.approx(4.0 + 0.8 * FULL, abs=1e-12)
    sms = SmShare()
    sms.hold(5.0, 100.0, 4)           # 5 s alone (half the work), then shared
    assert sms.stretch(0.0, FULL, shared) == pytest.approx(5.0 + 0.5 * SHARED, abs=1e-12)


def test_overlapping_kernels_hold_their_sum() -> None:
    sms = SmShare()
    sms.hold(0.0, 100.0, 4)
    sms.hold(0.0, 100.0, 4)
    assert sms.stretch(0.0, FULL, shared) == pytest.approx(2 * SHARED, abs=1e-12)


def test_a_gemm_under_a_collective_runs_on_the_sms_left() -> None:
    spec = load_device("a100-sxm4-80gb")
    model, net = device_cost(spec), load_network("dgx-a100")
    blocks = net.kernel_blocks("ring", "simple", 100e6, 8)
    assert blocks == net.channels == 24            # a large call runs every channel
    assert net.kernel_blocks("ring", "ll", 1024, 8) < blocks
    assert load_network("dgx-h100").kernel_blocks("nvls", "simple", 100e6, 8) == 16
    assert load_network("t3-ring").kernel_blocks("ring", "simple", 100e6, 8) == 0
    tl = Timeline()
    tl.sms.hold(0.0, 1.0, blocks)
    g = ops.gemm(tl, model, "wgrad", 6144, 3072, 8192, dtype="fp16")
    left = model.gemm(6144, 3072, 8192, dtype="fp16", compute_units=spec.compute_units - blocks)
    assert g.duration == pytest.approx(left.time_s, rel=1e-12)
    assert g.duration > model.gemm(6144, 3072, 8192, dtype="fp16").time_s

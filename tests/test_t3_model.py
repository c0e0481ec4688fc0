"""The T3 hardware model: DRAM contention, arbitration, CU sharing, preset parameters."""
from __future__ import annotations

import math
from importlib import resources
from pathlib import Path

import pytest

from mpiemu.devices import load_device, device_cost
from mpiemu.devices.contention import (NO_CONTENTION, StageDemand, T3Params, comm_dram_bw, mca,
                                  round_robin, solve_stage, stage_s)
from mpiemu.devices.presets import PresetError, all_quantities, read_preset
from mpiemu.overlap.costs import gemm_plan, rs_costs
from mpiemu.overlap.strategy import Overlap

BW = 900e9


PRESET = load_device("t3-gpu").t3
assert PRESET is not None


@pytest.fixture
def params() -> T3Params:
    assert PRESET is not None
    return PRESET


def stage(read_mb: float, write_mb: float = 5.0, time_us: float = 80.0,
          uncached: bool = True) -> StageDemand:
    r, w = read_mb * 1e6, write_mb * 1e6
    return StageDemand(time_us * 1e-6, r, 2 * w, r + (w if uncached else 0.0))


def test_every_overlap_parameter_of_the_preset_has_a_source() -> None:
    extra = all_quantities(read_preset("t3-gpu"))["t3"]
    assert {"nmc_update_cost", "dram_queue_entries", "mca_threshold_high", "comm_cu_bw"} <= \
        set(extra)
    assert all(f"t3.{k}" in load_device("t3-gpu").sources for k in
               ("nmc_update_cost", "mca_starvation_limit_cycles", "comm_cu_bw_bytes_per_s"))
    assert all(q.source.strip() for q in extra.values())


def test_preset_carries_the_thesis_numbers(params: T3Params) -> None:
    assert params.nmc_update_cost == 2.0               # Table 8.1: CCDWL = 2 x CCDL
    assert params.mca_thresholds == (5, 10, 30)        # 8.5.1.3


def test_missing_parameters_are_named(tmp_path: Path) -> None:
    text = (Path(str(resources.files("mpiemu.devices") / "presets")) / "t3-gpu.toml").read_text()
    bad = tmp_path / "no-comm-cu.toml"
    bad.write_text("\n".join(x for x in text.splitlines() if not x.startswith("comm_cu_bw")))
    with pytest.raises(PresetError, match=r"t3-gpu.t3: missing 'comm_cu_bw'"):
        load_device(str(bad))


def test_no_contention_keeps_the_isolated_time() -> None:
    d = stage(40.0)
    assert stage_s(d, 50e6, NO_CONTENTION, BW) == d.time_s


def test_a_cache_resident_gemm_barely_slows_a_memory_intensive_one_does() -> None:
    """Thesis 8.5.1.2: OP GEMMs fit the LLC and barely slow; large FC GEMMs slow down."""
    comm = 15e6
    resident, streaming = stage(0.5, write_mb=0.0), stage(40.0, write_mb=0.0)
    slow_resident = stage_s(resident, comm, round_robin(PRESET), BW) / resident.time_s - 1
    slow_streaming = stage_s(streaming, comm, round_robin(PRESET), BW) / streaming.time_s - 1
    assert slow_resident < 0.02 < 0.2 < slow_streaming


def test_mca_stalls_a_gemm_less_than_round_robin(params: T3Params) -> None:
    d = stage(40.0)
    assert stage_s(d, 30e6, mca(params, 0.4), BW) < stage_s(d, 30e6, round_robin(PRESET), BW)


def test_mca_threshold_shrinks_with_memory_intensity(params: T3Params) -> None:
    got = [params.mca_threshold(i) for i in (0.5, 0.2, 0.1, 0.01)]
    assert got == [5, 10, 30, params.dram_queue_entries]


def test_round_robin_exposure_is_the_presets_and_overridable() -> None:
    """The exposure sits in the [t3] preset section (thesis 8.3.5's two accesses) and
    `--set device.t3.round_robin_exposure=1` halves a streaming GEMM's stall."""
    from mpiemu.config.workload import load_workload, resolve_device  # noqa: PLC0415
    assert PRESET is not None and PRESET.round_robin_exposure == 2.0
    w = load_workload("workloads/t3_sublayers.toml", ["device.t3.round_robin_exposure=1"])
    one = resolve_device(w).t3
    assert one is not None and round_robin(one).exposure == 1.0
    d = stage(40.0, write_mb=0.0)
    stall = [stage_s(d, 15e6, round_robin(p), BW) - d.time_s for p in (PRESET, one)]
    assert stall[1] == pytest.approx(stall[0] / 2, rel=1e-9)


def test_round_robin_halves_a_saturated_dram_compute_first_keeps_the_starvation_share(
        params: T3Params) -> None:
    assert comm_dram_bw(BW, round_robin(PRESET), BW) == pytest.approx(BW / 2)
    share = params.dram_burst_cycles / params.mca_starvation_limit_cycles
    assert comm_dram_bw(BW, mca(params, 0.5), BW) == pytest.approx(share * BW)
    assert comm_dram_bw(0.3 * BW, mca(params, 0.5), BW) == pytest.approx(0.7 * BW)


def test_stage_fixed_point_grows_with_the_traffic_it_overlaps() -> None:
    """Comm traffic at 300 GB/s of DRAM cost: the stretched stage sees more of it."""
    d = stage(40.0)
    dur, comm = solve_stage(d, lambda t: 300e9 * t, round_robin(PRESET), BW)
    assert dur > d.time_s
    assert dur == pytest.approx(stage_s(d, comm, round_robin(PRESET), BW), rel=1e-9)


def test_uncached_output_writes_are_exposed_to_the_ring() -> None:
    """T3's near-memory-updated output bypasses the LLC: its stores wait in the DRAM queue."""
    cached, uncached = stage(1.0, uncached=False), stage(1.0, uncached=True)
    assert stage_s(uncached, 20e6, round_robin(PRESET), BW) > stage_s(cached, 20e6, round_robin(PRESET),
                                                                  BW)


def test_gemm_on_fewer_cus_runs_more_stages() -> None:
    """Fig. 8.4: 64 of 80 CUs slow a large GEMM by about 20%."""
    m = device_cost(load_device("t3-gpu"))
    full, shared = m.gemm(16384, 3072, 1536), m.gemm(16384, 3072, 1536, compute_units=64)
    assert shared.n_stages > full.n_stages
    assert shared.time_s / full.time_s == pytest.approx(1.2, abs=0.05)


def test_nmc_reads_one_copy_per_reduce_scatter_step_baseline_reads_two() -> None:
    """Thesis Fig. 8.8: CUs read local and received copies, NMC-based T3 reads one."""
    base, t3 = rs_costs(Overlap("sequential"), 2.0), rs_costs(Overlap("t3"), 2.0)
    assert (base.steady.reads, t3.steady.reads) == (2, 1)
    assert t3.final.cost == 0 and base.final.cost == 3
    assert t3.first.cost == 0          # step 0 leaves by remote stores (remote_update)


def test_gemm_plan_positions_cover_the_output() -> None:
    plan = gemm_plan(device_cost(load_device("t3-gpu")), 8192, 4256, 1064, "fp16")
    assert plan.waves[0].pos0 == 0 and math.isclose(plan.waves[-1].pos1, 1.0)
    assert plan.wave_of(1.0) == plan.n_stages - 1 and plan.wave_of(1e-9) == 0
    assert plan.time_s == pytest.approx(plan.cost.time_s)

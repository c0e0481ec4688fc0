"""Sunway preset, LDM equations, GEMM tiling and attention costs against SWA / SwFormer."""
from __future__ import annotations

import math

import pytest

from mpiemu.net.presets import preset_dir
from mpiemu.devices import load_device, device_cost, read_preset
from mpiemu.devices.presets import all_quantities
from mpiemu.devices.sunway import (AttnShape, SunwayCost, SunwayOutOfMemory, SunwaySpec, ldm_bytes,
                              pad_free_tilings, paper_blocks)
from mpiemu.studies.sunway_rows import attention_rows, seed_rows
from mpiemu.config.listing import format_devices
from mpiemu.config.errors import ConfigError
from mpiemu.config.sunway_section import SunwaySection

PRESETS = ["sw26010pro", "sw26010pro-cg"]


@pytest.fixture(scope="module")
def model() -> SunwayCost:
    m = device_cost(load_device("sw26010pro"))
    assert isinstance(m, SunwayCost)
    return m


@pytest.mark.parametrize("name", PRESETS)
def test_every_sunway_number_has_a_source(name: str) -> None:
    secs = all_quantities(read_preset(name))
    assert "sunway" in secs
    for sec, qs in secs.items():
        for key, q in qs.items():
            assert q.source.strip(), f"{name}.{sec}.{key}"
    assert secs["compute"]["clock"].is_assumption
    net = all_quantities(read_preset("sunway", preset_dir(), "network.preset"))
    assert net["intra"]["bw"].is_assumption


def test_all_shared_preset_states_the_seed_numbers() -> None:
    d = load_device("sw26010pro")
    sw = SunwaySpec.for_device(d)
    assert (d.kind, d.compute_units, sw.cpes_per_cg) == ("sunway", 6, 64)
    assert d.peak("fp32") == d.peak("fp64") == 14e12 and d.peak("fp16") == 55e12
    assert d.dram_capacity_bytes == 96e9 and sw.dram_per_cg_bytes == 16e9
    assert sw.ldm_bytes == 256 * 1024 and sw.ldm_usable_bytes == 240 * 1024
    assert (sw.dma_theoretical_bytes_per_s, sw.dma_load_bytes_per_s,
            sw.dma_store_bytes_per_s, sw.rma_bytes_per_s) == (307e9, 211e9, 122e9, 460e9)


def test_a_16_kib_request_moves_at_the_measured_dma_rates() -> None:
    sw = SunwaySpec.for_device(load_device("sw26010pro"))
    b = 16 * 1024
    assert b / sw.dma_s(b, 1) * 6 == pytest.approx(211e9)
    assert b / sw.dma_s(b, 1, store=True) * 6 == pytest.approx(122e9)


def test_devices_command_lists_sunway_numbers_with_sources() -> None:
    text = "\n".join(format_devices("sw26010pro"))
    for key in ("sunway.ldm_usable", "sunway.dma_load", "sunway.rma", "sunway.rma_latency"):
        assert key in text
    assert "[ASSUMPTION]" in text and "SWA 4.3" in text


def test_single_cg_mode_is_one_cg_with_16_gb_and_the_same_head_time() -> None:
    cg = device_cost(load_device("sw26010pro-cg"))
    full = device_cost(load_device("sw26010pro"))
    assert cg.sw.core_groups == 1 and cg.sw.dram_capacity_bytes == 16e9
    shape = AttnShape(1, 1, 2048, 128)
    assert cg.attention("fwd", shape).head.time_s == pytest.approx(
        full.attention("fwd", shape).head.time_s, rel=1e-3)


@pytest.mark.parametrize("pass_,br,bc,h,dtype,kib", [
    ("fwd", 32, 128, 128, "fp32", 240), ("fwd", 16, 128, 128, "fp32", 216),
    ("bwd", 16, 64, 128, "fp32", 204), ("bwd", 32, 64, 128, "fp32", 248),
    ("fwd", 64, 128, 128, "fp16", 144), ("bwd", 64, 64, 128, "fp16", 168),
    ("bwd", 64, 128, 64, "fp16", 160)])
def test_ldm_equations_give_the_papers_kilobytes(pass_: str, br: int, bc: int, h: int,
                                                 dtype: str, kib: int) -> None:
    assert ldm_bytes(pass_, br, bc, h, dtype) == kib * 1024


def test_block_sizes_fit_the_usable_ldm_and_search_respects_it(model: SunwayCost) -> None:
    for pass_ in ("fwd", "bwd"):
        for dtype in ("fp32", "fp16"):
            for h in (64, 128):
                b = paper_blocks(pass_, dtype, h, 4096)
                assert ldm_bytes(pass_, b.br, b.bc, h, dtype) <= model.sw.ldm_usable_bytes
        b = model.blocks(pass_, AttnShape(1, 1, 2048, 128), "search")
        assert ldm_bytes(pass_, b.br, b.bc, 128, "fp32") <= model.sw.ldm_usable_bytes


def test_gemm_tilings_are_pad_free(model: SunwayCost) -> None:
    tilings = pad_free_tilings(8192, 1536, 4096, "fp32", model.sw)
    assert 50 <= len(tilings) <= 110                     # SWF A.2: 50-100 valid tilings
    assert all(8192 % t.m_div == 0 and 1536 % t.n_div == 0 for t in tilings)


def test_gemm_stages_are_waves_over_the_cgs_with_a_visible_tail(model: SunwayCost) -> None:
    g = model.gemm(8192, 2048, 4096, dtype="fp32")
    assert g.n_stages == math.ceil(g.tiling.tiles / 6)
    assert sum(s.tiles for s in g.stages) == g.tiling.tiles
    assert g.tail_idle_cgs == 6 - g.stages[-1].tiles and g.cg_utilization < 1.0
    fewer = model.gemm(8192, 2048, 4096, dtype="fp32", compute_units=3)
    assert fewer.time_s > g.time_s and max(s.tiles for s in fewer.stages) <= 3


def test_swattention_takes_one_head_time_per_round_of_six_cgs(model: SunwayCost) -> None:
    c24 = model.attention("fwd", AttnShape(3, 8, 2048, 128))
    c25 = model.attention("fwd", AttnShape(5, 5, 2048, 128))
    launch = model.spec.kernel_launch_s
    assert c24.time_s - launch == pytest.approx(4 * c24.head.time_s)
    assert c25.time_s - launch == pytest.approx(5 * c25.head.time_s)
    assert model.per_cg_busy_s(c25).count(5 * c25.head.time_s) == 1


def test_standard_attention_runs_out_of_memory_at_16k_and_swattention_does_not(
        model: SunwayCost) -> None:
    model.attention("fwd", AttnShape(3, 8, 8192, 128), kernel="standard")
    with pytest.raises(SunwayOutOfMemory, match="96 GB"):
        model.attention("fwd", AttnShape(3, 8, 16384, 128), kernel="standard")
    assert model.attention("bwd", AttnShape(3, 8, 16384, 128)).footprint_bytes < 2e9


def test_asynchronous_dma_is_never_slower_than_blocking(model: SunwayCost) -> None:
    for p in ("fwd", "bwd"):
        shape = AttnShape(3, 4, 2048, 128)
        assert model.attention(p, shape).time_s < model.attention(p, shape,
                                                                  async_dma=False).time_s


def test_required_speedups_lie_within_20_percent_of_the_seed(model: SunwayCost) -> None:
    """SWA 4.2's FP32 forward/backward and FP16 forward means, from the model alone."""
    rows = seed_rows(model, attention_rows(model, (1024, 2048, 4096, 8192)))
    required = [r for r in rows if r["required"]]
    assert len(required) == 6
    for r in required:
        assert abs(r["rel"]) <= 0.2, r


def test_sunway_section_refuses_unknown_values_and_mismatched_presets() -> None:
    with pytest.raises(ConfigError, match="sunway.scheduler"):
        SunwaySection(scheduler="fastest")
    with pytest.raises(ConfigError, match="sw26010pro-cg"):
        SunwaySection(mode="single-cg").check_device("sunway", 6)
    with pytest.raises(ConfigError, match="device.preset"):
        SunwaySection().check_device("gpu", 108)
    SunwaySection(mode="single-cg").check_device("sunway", 1)


def test_private_kv_copies_per_cpe_cost_more_dma_than_a_broadcast(model: SunwayCost) -> None:
    from dataclasses import replace
    private = SunwayCost(model.spec, replace(model.sw, kv_dma_copies=64))
    shape = AttnShape(3, 8, 2048, 128)
    one, many = model.attention("fwd", shape), private.attention("fwd", shape)
    assert many.head.dram_read_bytes > 4 * one.head.dram_read_bytes      # 64 K/V copies
    assert many.time_s > one.time_s


def test_searched_blocks_are_no_slower_than_the_papers(model: SunwayCost) -> None:
    shape = AttnShape(1, 6, 4096, 128)
    for p in ("fwd", "bwd"):
        assert model.attention(p, shape, blocks="search").time_s <= \
            model.attention(p, shape, blocks="paper").time_s * (1 + 1e-12)

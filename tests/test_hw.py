"""Hardware specs, presets with sources, and the GEMM stage model."""
from __future__ import annotations

import math

import pytest

from mpiemu.net import load_network
from mpiemu.devices import gemm, list_presets, load_device, device_cost, read_preset
from mpiemu.devices.presets import all_quantities

GPU_PRESETS = ["t3-gpu", "mi210", "a100-sxm4-80gb", "h100-sxm5"]


def test_required_gpu_presets_exist() -> None:
    assert set(GPU_PRESETS) <= set(list_presets())


@pytest.mark.parametrize("name", GPU_PRESETS)
def test_every_preset_number_has_a_source(name: str) -> None:
    for section, qs in all_quantities(read_preset(name)).items():
        for key, q in qs.items():
            assert q.source.strip(), f"{name}.{section}.{key} has no source"


def test_t3_gpu_matches_thesis_table_8_1() -> None:
    d = load_device("t3-gpu")
    assert d.compute_units == 80
    assert d.clock_hz == pytest.approx(1.4e9)
    assert d.llc_bytes == 16 * 2**20
    assert d.dram_bw_bytes_per_s == pytest.approx(1e12)
    net = load_network(d.network)
    assert net.intra.bw_bytes_per_s * 2 == pytest.approx(150e9)   # bidirectional
    assert net.intra.latency("simple") == pytest.approx(500e-9)
    assert net.topology == "ring" and net.base("ring", "simple") == 0.0


def test_unknown_preset_names_the_choices() -> None:
    with pytest.raises(ValueError, match="t3-gpu"):
        load_device("no-such-gpu")


def test_stage_count_follows_tiles_and_compute_units() -> None:
    d = load_device("t3-gpu")
    g = device_cost(d).gemm(4096, 3072, 384)
    tiles = math.ceil(4096 / d.gemm.tile_m) * math.ceil(3072 / d.gemm.tile_n)
    assert g.n_stages == math.ceil(tiles / (d.compute_units * d.gemm.wgs_per_cu))
    assert sum(s.tiles for s in g.stages) == tiles


def test_slicing_in_k_keeps_tiles_and_stages() -> None:
    """Thesis Fig. 8.3: a K-sliced GEMM has the same output, tiles and stages."""
    m = device_cost(load_device("t3-gpu"))
    full, sliced = m.gemm(16384, 3072, 3072), m.gemm(16384, 3072, 3072 // 8)
    assert full.n_stages == sliced.n_stages
    assert [s.tiles for s in full.stages] == [s.tiles for s in sliced.stages]
    assert sliced.flops == pytest.approx(full.flops / 8)


def test_partial_last_wave_underuses_the_device() -> None:
    d = load_device("t3-gpu")
    m = device_cost(d)
    wave = d.compute_units * d.gemm.wgs_per_cu
    n = d.gemm.tile_n
    one = m.gemm(wave * d.gemm.tile_m, n, 4096)
    plus_one = m.gemm((wave + 1) * d.gemm.tile_m, n, 4096)
    assert plus_one.n_stages == one.n_stages + 1
    # one extra tile costs a whole (mostly idle) stage's compute of one WG on one CU
    extra = plus_one.time_s - one.time_s
    per_tile_ideal = one.time_s / wave
    assert extra > 10 * per_tile_ideal


def test_cache_resident_gemm_reads_inputs_once() -> None:
    d = load_device("t3-gpu")
    m = device_cost(d)
    small = m.gemm(16384, 3072, 384)      # 12.6 MB + 2.4 MB of fp16 inputs < 16 MB LLC
    inputs = (16384 * 384 + 384 * 3072) * 2
    assert small.dram_read_bytes == pytest.approx(inputs, rel=0.05)
    big = m.gemm(16384, 3072, 1536)       # 50 MB + 9.4 MB: re-reads
    assert big.dram_read_bytes > 1.5 * (16384 * 1536 + 1536 * 3072) * 2


def test_llc_bypass_of_outputs_helps_cache_sensitive_gemms() -> None:
    m = device_cost(load_device("t3-gpu"))
    cached = m.gemm(16384, 3072, 1536)   # two waves' panels (15 MB) fit only without outputs
    bypass = m.gemm(16384, 3072, 1536, bypass_llc_output=True)
    assert bypass.dram_read_bytes < 0.8 * cached.dram_read_bytes


def test_elementwise_is_bandwidth_plus_launch() -> None:
    d = load_device("t3-gpu")
    t = device_cost(d).elementwise_s(1e9, 1e9)
    assert t == pytest.approx(2e9 / d.dram_stream_bw + d.kernel_launch_s)


@pytest.mark.parametrize("preset", ["a100-sxm4-80gb", "h100-sxm5", "t3-gpu"])
def test_weight_gradient_costs_as_its_m_n_swapped_twin(preset: str) -> None:
    """A wave's working set is K-blocked: a 1.7B model's FC-1 weight gradient (K = tokens)
    is not charged twice its M<->N-swapped twin (the old whole-panel LLC bug)."""
    m = device_cost(load_device(preset))
    wgrad, twin = m.gemm(2304, 9216, 16384), m.gemm(9216, 2304, 16384)
    assert wgrad.time_s == pytest.approx(twin.time_s, rel=0.05)


def test_tile_choice_and_split_k_follow_the_shape() -> None:
    m = device_cost(load_device("h100-sxm5"))
    big, skinny = m.gemm(8192, 8192, 8192), m.gemm(512, 512, 16384)
    assert (big.tile_m * big.tile_n, big.split_k) == (128 * 256, 1)
    assert skinny.split_k > 1                   # too few output tiles to fill 132 SMs
    assert big.tflops > 0.85 * 989.4 * 0.801 and skinny.tflops < big.tflops


@pytest.mark.parametrize("preset", ["h100-sxm5", "a100-pcie-40gb", "rtx3090"])
def test_skipping_candidates_by_their_floor_keeps_the_exhaustive_choice(preset: str) -> None:
    """gemm_cost skips a (tile, split) whose floor already loses; walking every candidate
    instead gives the same cost, bit for bit (shapes from skinny to batched); the floor is
    never above the walked waves' time."""
    spec = load_device(preset)
    epi = gemm.Epilogue(out_flops=5, out_sfu=1)
    for m_, n_, k_, b, dt, ep in [(512, 512, 16384, 1, "fp16", gemm.NO_EPILOGUE),
                                  (8192, 3072, 1024, 1, "bf16", gemm.NO_EPILOGUE),
                                  (2048, 2048, 96, 16, "fp16", epi),
                                  (300, 7, 4096, 4, "tf32", gemm.NO_EPILOGUE),
                                  (4096, 4096, 4096, 1, "fp32", gemm.NO_EPILOGUE)]:
        best = None
        for sh in gemm._candidates(spec, m_, n_, k_, b, 2, 2, ep):
            stages = tuple(gemm._waves(spec, sh, dt, spec.compute_units, False))
            stages += (gemm._split_reduce(spec, sh),) if sh.split > 1 else ()
            t = spec.kernel_launch_s + sum(s.time_s for s in stages)
            walked = sum(s.time_s for s in stages[:len(stages) - (sh.split > 1)])
            assert gemm._floor_s(spec, sh, dt, spec.compute_units) <= walked * (1 + 1e-12)
            if best is None or t < best[0] * (1 - gemm.TIE):
                best = (t, sh.tm, sh.tn, sh.split)
        got = gemm.gemm_cost(spec, m_, n_, k_, dtype=dt, batch=b, epilogue=ep)
        assert (got.time_s, got.tile_m, got.tile_n, got.split_k) == best


def test_tf32_runs_on_tensor_cores_and_fp32_on_cuda_cores() -> None:
    m = device_cost(load_device("a100-sxm4-80gb"))
    tf32, fp32 = m.gemm(8192, 8192, 8192, dtype="tf32"), m.gemm(8192, 8192, 8192, dtype="fp32")
    assert 100 < tf32.tflops < 156 and fp32.tflops < 19.5

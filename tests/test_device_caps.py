"""Typed device capabilities: every field loadable, overridable with --set device.<path>,
scale knobs, unknown fields refused in one line, a custom preset's [sunway] honoured."""
from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

from mpiemu.devices import load_device, device_cost
from mpiemu.devices.caps import walk
from mpiemu.devices.presets import PresetError, list_presets
from mpiemu.devices.sunway import AttnShape, SunwayCost
from mpiemu.cli import main
from mpiemu.config.workload import load_workload, resolve_device
from mpiemu.config.listing import format_devices
from mpiemu.config.errors import ConfigError


def preset_text(name: str) -> str:
    return (Path(str(resources.files("mpiemu.devices") / "presets")) / f"{name}.toml").read_text()


def spec_with(preset: str, *overrides: str):  # type: ignore[no-untyped-def]
    w = load_workload(None, [f"device.preset='{preset}'", *overrides])
    return resolve_device(w)


def _changed(v: object) -> object:
    """A different valid value of the same type (bools flip, numbers grow a little)."""
    if isinstance(v, bool):
        return not v
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return v * 0.999 if v != float("inf") else 1e12
    return v


@pytest.mark.parametrize("preset", list_presets())
def test_every_capability_can_be_set(preset: str) -> None:
    """`--set device.<path>=value` reaches every field the walk shows (and only those)."""
    base = load_device(preset)
    for path, v in walk(base):
        if path.startswith("scale.") or isinstance(v, str):
            continue
        new = _changed(v)
        value = repr(new).lower() if isinstance(new, bool) else repr(new)
        spec = spec_with(preset, f"device.{path}={value}")
        assert dict(walk(spec))[path] == new, path
        assert spec.sources[path].startswith("OVERRIDE"), path


def test_preset_units_work_in_overrides_too() -> None:
    spec = spec_with("t3-gpu", "device.dram_bw_GBps=2000", "device.gemm.wave_fixed_us=2")
    assert spec.dram_bw_bytes_per_s == 2e12
    assert spec.gemm.wave_fixed_s == pytest.approx(2e-6)


def test_scale_knobs_speed_up_compute_or_memory_alone() -> None:
    base = device_cost(spec_with("mi210"))
    fast = device_cost(spec_with("mi210", "device.scale.compute=2"))
    wide = device_cost(spec_with("mi210", "device.scale.memory_bw=2"))
    big = dict(m=8192, n=8192, k=8192)
    assert fast.gemm(**big).time_s == pytest.approx(base.gemm(**big).time_s / 2, rel=0.02)
    stream = (1e9, 1e9)                      # a memory-bound kernel
    assert fast.elementwise_s(*stream) == base.elementwise_s(*stream)
    launch = base.spec.kernel_launch_s
    assert wide.elementwise_s(*stream) - launch == \
        pytest.approx((base.elementwise_s(*stream) - launch) / 2)
    assert fast.spec.scale.compute == 2 and "SCALED" in fast.spec.sources["clock_hz"]


def test_a_base_clock_lock_slows_the_sms_and_unthrottles_the_matrix_units() -> None:
    """A profiler's clock lock at base (rated TDP): SM-side rates scale with the clock, the
    memory keeps its own, and a compute-bound GEMM runs at the per-clock efficiency."""
    spec = load_device("a100-pcie-40gb")
    lock = spec.at_base_clock()
    ratio = spec.base_clock_hz / spec.clock_hz
    assert lock.clock_hz == spec.base_clock_hz and ratio < 1
    assert lock.peak("fp16") == pytest.approx(spec.peak("fp16") * ratio)
    assert lock.sfu_ops_per_s == pytest.approx(spec.sfu_ops_per_s * ratio)
    assert lock.dram_bw_bytes_per_s == spec.dram_bw_bytes_per_s
    assert lock.gemm.efficiency == spec.gemm.unthrottled_efficiency > spec.gemm.efficiency
    big = dict(m=8192, n=8192, k=8192)
    expect = device_cost(spec).gemm(**big).time_s / ratio \
        * spec.gemm.efficiency / spec.gemm.unthrottled_efficiency
    assert device_cost(lock).gemm(**big).time_s == pytest.approx(expect, rel=0.03)
    assert lock.at_base_clock().gemm == lock.gemm
    with pytest.raises(ValueError, match="base_clock_hz=0.0; a clock lock needs"):
        load_device("t3-gpu").at_base_clock()


@pytest.mark.parametrize("override, needle", [
    ("device.gemm.effciency=0.9", "device.gemm.effciency=0.9: unknown field; allowed here: "),
    ("device.dram_bandwidth=1", "device.dram_bandwidth=1: unknown field"),
    ("device.gemm.tile_m=3.5", "device.gemm.tile_m=3.5: an integer"),
    ("device.gemm=3", "device.gemm=3: is a section"),
    ("device.peak_flops_per_s.int4=1", "name one entry"),
    ("device.scale.flops=2", "device.scale.flops=2: unknown field; allowed here: compute, "
                             "memory_bw"),
    ("device.scale.compute=0", "a factor > 0"),
    ("device.nmc.banks=16", "has no [nmc] section"),
    ("device.gemm.efficiency=1.5", "device.gemm.efficiency=1.5: "),
    ("device.gemm.unthrottled_efficiency=2", "device.gemm.unthrottled_efficiency=2: "),
])
def test_bad_overrides_are_one_config_error(override: str, needle: str) -> None:
    with pytest.raises(ConfigError) as exc:
        spec_with("t3-gpu", override)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_devices_command_marks_overrides_and_refuses_typos(capsys: pytest.CaptureFixture[str]
                                                           ) -> None:
    text = "\n".join(format_devices("t3-gpu", overrides=["device.t3.dram_queue_entries=32"]))
    assert "t3.dram_queue_entries" in text and "[OVERRIDE]" in text
    assert main(["devices", "t3-gpu", "--set", "device.t3.queue=3"]) == 2
    assert "device.t3.queue=3: unknown field" in capsys.readouterr().err


def test_a_custom_presets_sunway_section_is_honoured(tmp_path: Path) -> None:
    """Issue 11: a preset file given by path is read whole, its [sunway] included."""
    text = preset_text("sw26010pro").replace('name = "sw26010pro"', 'name = "my-sunway"')
    slow = text.replace("exp_cycles_count = { value = 12.0", "exp_cycles_count = { value = 48.0")
    assert slow != text
    path = tmp_path / "my-sunway.toml"
    path.write_text(slow)
    shape = AttnShape(1, 8, 2048, 128)
    mine, ref = (device_cost(load_device(p)) for p in (str(path), "sw26010pro"))
    assert isinstance(mine, SunwayCost) and isinstance(ref, SunwayCost)
    assert mine.sw.exp_cycles == 48.0
    assert mine.attention("fwd", shape).time_s > ref.attention("fwd", shape).time_s
    by_override = spec_with("sw26010pro", "device.sunway.exp_cycles=48")
    assert device_cost(by_override).attention("fwd", shape).time_s == \
        mine.attention("fwd", shape).time_s  # type: ignore[attr-defined]


def test_a_preset_entry_no_field_reads_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "typo.toml"
    path.write_text(preset_text("t3-gpu").replace("[memory]", "[memory]\nlcc_MiB = { value "
                                                  "= 16, source = 'typo'}"))
    with pytest.raises(PresetError, match=r"memory.lcc_MiB: no field of the device spec"):
        load_device(str(path))
    path.write_text(preset_text("t3-gpu").replace("llc_MiB", "lcc_MiB"))
    with pytest.raises(PresetError, match=r"t3-gpu.memory: missing 'llc'"):
        load_device(str(path))

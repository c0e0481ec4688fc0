"""Workload parsing: defaults, overrides, and one-line errors naming field and value."""
from __future__ import annotations

from pathlib import Path

import pytest

from mpiemu.config.workload import load_workload, resolve_device, resolve_network
from mpiemu.config.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def test_defaults_load_without_a_file() -> None:
    w = load_workload(None)
    assert w.parallel.tp == 1 and w.run.kind == "collectives"


def test_overrides_are_parsed_as_toml_values(root) -> None:
    w = load_workload(root / "workloads/collectives.toml",
                      ["parallel.tp=2", "parallel.dp=2", "collectives.bidirectional=true",
                       'collectives.sizes=["4KiB", 8192]'])
    assert (w.parallel.tp, w.parallel.dp) == (2, 2)
    assert w.collectives.bidirectional is True
    assert w.collectives.size_bytes == [4096, 8192]


@pytest.mark.parametrize("override, field", [
    ("parallel.tpp=2", "parallel.tpp"),
    ("device.preset=nope", "device.preset"),
    ("collectives.sizes=[-5]", "collectives.sizes[0]"),
    ("collectives.sizes=['lots']", "collectives.sizes[0]"),
    ("parallel.tp=0", "parallel.tp"),
    ("parallel.tp=two", "parallel.tp"),
    ("parallel.tp=10792118836", "parallel.tp*parallel.dp*parallel.pp"),
    ("run.numerics=maybe", "run.numerics"),
    ("network.intra.latency_s.simple=-3", "network.intra"),
    ("network.intra.bw_GBps=0", "network.intra"),
    ("network.topology=torus", "network.topology"),
    ("network.preset=nope", "network.preset"),
    ("network.nope=1", "network.nope"),
    ("collectives.algorithm=butterfly", "collectives.algorithm"),
    ("collectives.protocol=ll64", "collectives.protocol"),
    ("optimizer.lr=nan", "optimizer.lr"),
    ("train.dp_bucket_MiB=inf", "train.dp_bucket_MiB"),
    ("network.intra.bw_GBps=inf", "network.intra"),
    ("device.dram_bw_GBps=nan", "device.dram_bw"),
    ("parallel..tp=2", "--set"),
    ("debug.fail_rank=5", "debug.fail_rank"),
    ("debug.fail_rank=-2", "debug.fail_rank"),
])
def test_bad_values_name_the_field_and_value(override: str, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_workload(None, [override]).check_world(1)
    msg = str(info.value)
    assert msg.startswith(field)
    assert "\n" not in msg


def test_world_size_mismatch_says_what_is_allowed() -> None:
    w = load_workload(None, ["parallel.tp=2", "parallel.dp=3"])
    with pytest.raises(ConfigError, match="must equal the 4 ranks"):
        w.check_world(4)


def test_network_overrides_replace_the_preset_fields() -> None:
    w = load_workload(None, ["network.intra.bw_GBps=10", "network.intra.latency_s.simple=0"])
    net = resolve_network(w, resolve_device(w))
    assert net.name == "t3-ring"
    assert net.intra.bw_bytes_per_s == 10e9 and net.intra.latency("simple") == 0.0
    scaled = resolve_network(load_workload(None, ["network.scale.bw=2"]), resolve_device(w))
    assert scaled.intra.bw_bytes_per_s == 150e9


@pytest.mark.parametrize("overrides, world, field", [
    (["device.preset=a100-sxm4-80gb", "network.devices_per_node=3"], 8,
     "network.devices_per_node"),
    (["network.preset=pcie-gen4", "network.devices_per_node=2"], 4, "network.topology"),
])
def test_network_that_cannot_hold_the_job_is_one_line(overrides: list[str], world: int,
                                                     field: str) -> None:
    w = load_workload(None, [*overrides, f"parallel.tp={world}"])
    with pytest.raises(ConfigError) as info:
        w.check_world(world)
    assert str(info.value).startswith(field) and "\n" not in str(info.value)


def test_config_hash_changes_with_content() -> None:
    a = load_workload(None).config_hash()
    b = load_workload(None, ["run.seed=3"]).config_hash()
    assert a != b and a == load_workload(None).config_hash()


def test_heterogeneous_gpu_ranks_resolve_their_own_presets() -> None:
    w = load_workload(None, ["parallel.tp=2", 'device.rank_presets=["h100-sxm5", "mi210"]'])
    w.check_world(2)
    assert resolve_device(w, 0).name == "h100-sxm5" and resolve_device(w, 1).name == "mi210"


def test_rank_presets_need_one_entry_per_rank() -> None:
    w = load_workload(None, ["parallel.tp=3", 'device.rank_presets=["mi210", "mi210"]'])
    with pytest.raises(ConfigError, match="one preset per rank: 3 entries"):
        w.check_world(3)


def test_mixing_gpu_and_sunway_ranks_is_refused_in_one_line() -> None:
    w = load_workload(None, ["parallel.tp=2", 'device.rank_presets=["t3-gpu", "sw26010pro"]'])
    with pytest.raises(ConfigError) as info:
        w.check_world(2)
    assert "GPU and Sunway ranks cannot share a job" in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("overrides, field", [
    (["debug.fail_rank=0", "debug.fail_iteration=-1"], "debug.fail_iteration"),
    (["debug.fail_rank=0", "run.kind=train", "debug.fail_iteration=3"], "debug.fail_iteration"),
])
def test_a_fault_the_run_would_never_reach_is_refused(overrides: list[str], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_workload(None, [*overrides, "model.preset=tiny"]).check_world(1)
    assert str(info.value).startswith(field)


@pytest.mark.parametrize("override", ["model.layers=1000000007", "model.hidden=1000000007"])
def test_absurd_model_sizes_are_refused_at_once(override: str) -> None:
    """Validation does not walk the layers: a billion of them is refused, not looped over."""
    from mpiemu.runner.job import validate
    with pytest.raises(ConfigError) as info:
        validate(None, ["run.kind=train", "model.preset=tiny", override], 1)
    assert str(info.value).startswith(override.split("=")[0])


def _out_of_range_preset(tmp: Path) -> str:
    """The tiny model's preset with a hidden size past float range (TOML reads inf)."""
    text = (ROOT / "mpiemu/model/presets/tiny.toml").read_text()
    path = tmp / "huge.toml"
    path.write_text(text.replace("value = 64,", "value = 1e999,", 1))
    return f"model.preset={path}"


@pytest.mark.parametrize("overrides, field", [
    (["train.global_batch=99999999999"], "train.global_batch"),           # ran forever
    (["overlap.strategy=t3", "overlap.pieces=1000000007"], "overlap.pieces"),  # MemoryError
    (["overlap.strategy=sw-overlap", "overlap.comm_cus=80"], "overlap.comm_cus"),
    (["run.seed=-1"], "run.seed"),                                        # accepted silently
    ([], "model.preset"),                                                 # OverflowError
])
def test_fuzz_findings_are_refused_in_one_line(tmp_path: Path, overrides: list[str],
                                               field: str) -> None:
    from mpiemu.runner.job import validate
    sets = overrides or [_out_of_range_preset(tmp_path)]
    with pytest.raises(ConfigError) as info:
        validate("workloads/quickstart.toml", sets, 4)
    msg = str(info.value)
    assert msg.startswith(field) and "\n" not in msg


@pytest.mark.parametrize("override, guess", [
    ("train.iterations=3", "did you mean run.iterations?"),        # the right section
    ("run.itterations=3", "did you mean run.iterations?"),          # a typo
    ("parallel.tpp=2", "did you mean parallel.tp or"),
])
def test_a_misplaced_or_misspelled_key_says_what_it_may_have_meant(override: str,
                                                                     guess: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_workload("workloads/quickstart.toml", [override])
    msg = str(info.value)
    assert msg.startswith(override.split("=")[0]) and guess in msg and "\n" not in msg

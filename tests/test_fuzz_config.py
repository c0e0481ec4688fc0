"""Fuzzing the workload loader: mutated `--set` overrides of every bundled workload
either validate into a workload with only finite numbers, or are refused with one line naming
the field; never another exception, never a hang (a Hypothesis deadline per case)."""
from __future__ import annotations

import dataclasses
import math
import os
import tomllib
from pathlib import Path
from typing import Any, Iterator

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mpiemu.config.errors import ConfigError
from mpiemu.runner.job import validate
from tests.conftest import ROOT

WORKLOADS = sorted((ROOT / "workloads").glob("*.toml"))


def _leaves(table: dict[str, Any], prefix: str = "") -> Iterator[str]:
    for k, v in table.items():
        if isinstance(v, dict):
            yield from _leaves(v, f"{prefix}{k}.")
        else:
            yield prefix + k


KEYS = sorted({k for p in WORKLOADS for k in _leaves(tomllib.loads(p.read_text()))}
              | {"network.intra.bw_GBps", "network.devices_per_node", "network.preset",
                 "network.scale.bw", "collectives.algorithm", "collectives.protocol",
                 "debug.fail_rank", "debug.fail_iteration", "device.scale.compute",
                 "model.layers", "model.hidden", "model.heads", "model.seq_len",
                 "train.global_batch", "optimizer.lr", "overlap.pieces", "name",
                 "run.kind", "run.numerics", "run.numerics_budget_tflop",
                 "collectives.sizes"})
VALUES = st.one_of(
    st.sampled_from(["nan", "inf", "-inf", "0", "-1", "1", "2", "3", "1e308", "1e-308",
                     "1000000007", "18446744073709551617", "true", "''", "'x'", "[]", "{}",
                     "[1, 2]", "'16GiB'", "'ring'", "'nvls'", "'hierarchical'", "'ll'",
                     "'dgx-a100'", "'a\\nb'", "0.5", "-0.0", "'train'", "'sublayers'",
                     "'layer_sweep'", "'on'", "'off'", "['16GiB']", "['1KiB', 5]",
                     "'../x'", "'a/b'"]),
    st.integers(min_value=-2**40, max_value=2**40).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(
        lambda f: "nan" if math.isnan(f) else ("inf" if f == math.inf else
                                               "-inf" if f == -math.inf else repr(f))),
)
OVERRIDE = st.tuples(st.sampled_from(KEYS + ["bogus.key", "model.bogus", "parallel"]),
                     VALUES).map(lambda kv: f"{kv[0]}={kv[1]}")


def _finite(obj: Any, where: str = "") -> None:
    """Every number of an accepted workload is finite."""
    if dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            _finite(getattr(obj, f.name), f"{where}.{f.name}")
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _finite(v, f"{where}.{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _finite(v, f"{where}[{i}]")
    elif isinstance(obj, float):
        assert math.isfinite(obj), f"accepted a non-finite {where}={obj}"


@settings(max_examples=2000, deadline=5000, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(workload=st.sampled_from(WORKLOADS), overrides=st.lists(OVERRIDE, max_size=3),
       world=st.sampled_from([1, 2, 4, 8]))
def test_mutated_workloads_validate_or_refuse_in_one_line(workload: Path,
                                                         overrides: list[str],
                                                         world: int) -> None:
    try:
        w = validate(str(workload), overrides, world)
    except ConfigError as exc:
        msg = str(exc)
        assert msg and "\n" not in msg and "=" in msg, msg
        return
    _finite(w)


# cheap launches of bundled workloads: (workload, ranks, settings that keep it small)
LAUNCHES = [
    ("workloads/collectives.toml", 2, ["run.numerics=off", "collectives.sizes=['4KiB']",
                                       "parallel.tp=2"]),
    ("workloads/quickstart.toml", 4, ["run.iterations=1"]),
    ("workloads/pipeline-small.toml", 2, ["run.numerics=off", "run.iterations=1",
                                          "train.check_reference=false"]),    # folded
]
# examples through mpiexec: 12 in `make test`; MPIEMU_FUZZ_RUNS=200 for the wider sweep
FUZZ_RUNS = int(os.environ.get("MPIEMU_FUZZ_RUNS", "12"))


@settings(max_examples=FUZZ_RUNS, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(launch=st.sampled_from(LAUNCHES), overrides=st.lists(OVERRIDE, max_size=2))
def test_mutated_runs_finish_cleanly_under_mpiexec(launch: tuple[str, int, list[str]],
                                                   overrides: list[str]) -> None:
    """A real small job (2 or 4 ranks): exit 0, or a one-line refusal; never a traceback,
    never a hang (MPIEXEC_TIMEOUT 60 s)."""
    import tempfile
    from tests.conftest import our_lines, run_mpi
    workload, ranks, base = launch
    with tempfile.TemporaryDirectory() as tmp:
        args = ["run", workload, "--out", f"{tmp}/run"]
        for o in [*base, *overrides]:
            args += ["--set", o]
        res = run_mpi(ranks, args, timeout=60)
    assert "Traceback" not in res.stderr + res.stdout, res.stderr
    lines = our_lines(res.stderr)
    assert res.returncode == 0 or (len(lines) == 1 and lines[0].startswith("mpiemu")), \
        (workload, overrides, res.returncode, res.stderr[-500:])


PRESETS = [p for room in ("devices", "net", "model")
           for p in sorted((ROOT / "mpiemu" / room / "presets").glob("*.toml"))]
assert PRESETS
DAMAGE = st.sampled_from(["nan", "inf", "-1", "0", "1e400", "'x'", "true", "[]", "{}",
                          "{ value = 1.0 }", "{ value = 'x', source = 's' }",
                          "{ value = nan, source = 's' }", "{ value = -5, source = 's' }",
                          "{ value = 1e308, source = 's' }"])


def _mutate(text: str, line: int, value: str) -> str:
    """Replace the right-hand side of the line-th `key = ...` line (or add a junk key)."""
    lines = text.splitlines()
    keyed = [i for i, ln in enumerate(lines) if "=" in ln and not ln.lstrip().startswith("#")]
    if not keyed:
        return text
    i = keyed[line % len(keyed)]
    key = lines[i].split("=", 1)[0]
    lines[i] = f"{key}= {value}"
    return "\n".join(lines) + "\n"


@settings(max_examples=300, deadline=5000, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(preset=st.sampled_from(PRESETS), line=st.integers(0, 200), value=DAMAGE)
def test_damaged_presets_are_refused_in_one_line(preset: Path, line: int, value: str,
                                                 tmp_path_factory: Any) -> None:
    """A preset file whose numbers were damaged loads to finite values or is refused with
    one line naming the entry; never another exception."""
    from mpiemu.devices.presets import PresetError, load_device
    from mpiemu.net import load_network
    d = tmp_path_factory.mktemp("p")
    f = d / preset.name
    f.write_text(_mutate(preset.read_text(), line, value))
    if preset.parent.parent.name == "model":        # through the loader a run takes
        try:
            _finite(validate("workloads/quickstart.toml", ["run.numerics=off",
                                                           f"model.preset='{f}'"], 4))
        except ConfigError as exc:
            assert str(exc) and "\n" not in str(exc), str(exc)
        return
    loader = load_network if preset.parent.name == "presets" and \
        preset.parent.parent.name == "net" else load_device
    try:
        spec = loader(str(f))
    except (PresetError, ValueError) as exc:
        assert str(exc) and "\n" not in str(exc), str(exc)
        return
    from mpiemu.devices.caps import walk
    unlimited = {p for p, v in walk(loader(str(preset)))          # defaults meaning "no
                 if isinstance(v, float) and not math.isfinite(v)}  # limit" stay infinite
    bad = [p for p, v in walk(spec) if isinstance(v, float) and not math.isfinite(v)
           and p not in unlimited]
    assert not bad, f"accepted non-finite {bad}"

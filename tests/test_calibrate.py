"""`mpiemu calibrate` writes a preset that loads and runs."""
from __future__ import annotations

from pathlib import Path

from mpiemu.net import load_network
from mpiemu.devices import load_device
from tests.conftest import run_mpi


def test_calibrated_preset_loads_with_measured_network(tmp_path: Path) -> None:
    out = tmp_path / "host.toml"
    res = run_mpi(2, ["calibrate", "--out", str(out)])
    assert res.returncode == 0, res.stderr
    spec = load_device(str(out))
    assert spec.peak("fp32") > 0 and spec.dram_bw_bytes_per_s > 0
    assert "MPI ping-pong" in load_network(spec.network).sources["intra.bw_bytes_per_s"]
    run = run_mpi(2, ["run", "workloads/collectives.toml", "--set", f"device.preset={out}",
                      "--set", "parallel.tp=2", "--set", 'collectives.sizes=["4KiB"]',
                      "--out", str(tmp_path / "run")])
    assert run.returncode == 0, run.stderr

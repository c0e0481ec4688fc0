"""The layer_sweep kind (thesis ch. 5): one emulated layer per point, serialized TP share,
DP all-reduce over the backward GEMMs, compute scale as device.scale.compute."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest
from mpi4py import MPI

from mpiemu.config.workload import load_workload
from mpiemu.config.errors import ConfigError
from mpiemu.runner.layer_sweep import validate
from mpiemu.runner.job import run_workload

BASE = ["run.kind='layer_sweep'", "run.numerics='off'", "device.preset='mi210'",
        "layer_sweep.hidden=[2048, 8192]", "layer_sweep.seq_len=[1024]", "layer_sweep.batch=[1]",
        "layer_sweep.head_dim=128"]


@pytest.mark.parametrize("override, needle", [
    ("run.numerics='on'", "run.numerics='on': layer_sweep is timing only"),
    ("parallel.tp=3", "layer_sweep.hidden[0]=2048: needs a multiple of head_dim=128 whose head "
                      "count divides by parallel.tp=3"),
    ("layer_sweep.compute_scale=[0]", "layer_sweep.compute_scale[0]=0"),
])
def test_bad_sweeps_are_one_config_error(override: str, needle: str) -> None:
    with pytest.raises(ConfigError) as exc:
        w = load_workload(None, [*BASE, override])
        validate(w, w.parallel.tp)
    assert needle in str(exc.value)


def _rows(out: Path, *extra: str) -> list[dict[str, str]]:
    run_workload(None, [*BASE, *extra], str(out), [], world=MPI.COMM_WORLD)
    MPI.COMM_WORLD.Barrier()
    with (out / "layer_sweep.csv").open() as f:
        return list(csv.DictReader(f))


@pytest.mark.mpi(min_size=2)
def test_tp_share_grows_with_compute_speed_and_falls_with_width(mpi_tmp_path: Path) -> None:
    n = MPI.COMM_WORLD.Get_size()
    if n not in (2, 4):
        pytest.skip("tp = 2 (x dp = 2 on 4 ranks)")
    rows = _rows(mpi_tmp_path, "parallel.tp=2", f"parallel.dp={n // 2}",
                 "layer_sweep.compute_scale=[1, 2]")
    assert len(rows) == 4
    share = {(int(r["hidden"]), float(r["compute_scale"])): float(r["tp_share"]) for r in rows}
    assert all(0 < s < 1 for s in share.values())
    assert share[(2048, 2.0)] > share[(2048, 1.0)] and share[(8192, 2.0)] > share[(8192, 1.0)]
    assert share[(8192, 1.0)] < share[(2048, 1.0)]              # thesis 5.2.3: (H + SL) / TP
    bwd = {(int(r["hidden"]), float(r["compute_scale"])): float(r["bwd_gemm_s"]) for r in rows}
    # every GEMM runs on the point's device, the ones paired with a TP ring included
    # (fc1 / qkv input gradients): compute-bound GEMMs 2x faster take half the time
    assert bwd[(8192, 1.0)] / bwd[(8192, 2.0)] == pytest.approx(2.0, rel=0.02)
    for r in rows:                  # compute 2x faster: the layer's compute time halves-ish
        assert float(r["compute_s"]) > 0 and float(r["tp_comm_s"]) > 0
        assert (float(r["dp_over_bwd"]) > 0) == (n == 4)
        assert 0 < float(r["attn_core_s"]) < float(r["compute_s"])
        # over DP: the FC weight alone (4H x H / TP) moves a third of the layer's bucket
        assert float(r["dp_layer_s"]) > float(r["dp_comm_s"]) or n == 2
    again = _rows(mpi_tmp_path / "again", "parallel.tp=2", f"parallel.dp={n // 2}",
                  "layer_sweep.compute_scale=[1, 2]")
    assert again == rows                                       # deterministic

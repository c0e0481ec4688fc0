"""Near-bank compute for optimizer updates (thesis ch. 6): access lists, row cycles, the
GPU vs NMC comparison, and `optimizer.on = "nmc"` in a training run (same math, new charge)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

from mpiemu.analysis import load
from mpiemu.devices import load_device
from mpiemu.devices.caps import set_path
from mpiemu.devices.nmc import (bank_access_s, chunk_s, gpu_update_s, nmc_update, update_accesses,
                           update_bytes)
from mpiemu.config.workload import load_workload
from mpiemu.config.errors import ConfigError
from mpiemu.runner.job import run_workload
from mpiemu.runner.train import validate


def test_lamb_touches_13_values_adam_7_per_parameter() -> None:
    """Thesis Fig. 6.2: LAMB reads and writes 13 parameters; fp32: 52 bytes."""
    lamb, adam = update_accesses("lamb", 4), update_accesses("adam", 4, global_norm=False)
    assert len(lamb) == 13 and update_bytes(lamb, 1) == 52
    assert len(adam) == 7 and update_bytes(adam, 1) == 28
    assert update_bytes(update_accesses("lamb", 2, copy_bytes=2), 1) == 52 - 2 * 2 + 2


def test_a_chunk_is_one_row_cycle() -> None:
    nmc = load_device("mi100").nmc
    assert nmc is not None
    cols = int(nmc.ts_bytes / nmc.column_bytes)
    read = max(nmc.t_ras_s, nmc.t_rcd_s + cols * nmc.t_ccd_s + nmc.t_rtp_s) + nmc.t_rp_s
    assert chunk_s(nmc, nmc.ts_bytes, write=False) == pytest.approx(read)
    assert chunk_s(nmc, nmc.ts_bytes, write=True) > chunk_s(nmc, nmc.ts_bytes, write=False)
    # a tensor of one parameter per bank still costs a whole row cycle
    assert bank_access_s(nmc, nmc.banks, 4, False) == chunk_s(nmc, 4, False)


def test_nmc_beats_the_ideal_gpu_and_gains_with_temporary_storage() -> None:
    spec = load_device("mi100")
    acc, sizes = update_accesses("lamb", 4), [1 << 20] * 64
    gpu = gpu_update_s(spec, acc, sum(sizes))
    base = nmc_update(spec, acc, sizes)
    big = nmc_update(set_path(spec, "nmc.ts_bytes", 1024), acc, sizes)
    assert gpu / base.time_s > 2 and big.time_s < base.time_s
    assert update_bytes(acc, sum(sizes)) / base.interface_bytes == pytest.approx(13, rel=0.01)
    # a slower GPU makes NMC look better (thesis 6.4: 80% / 90% of peak)
    assert gpu_update_s(spec, acc, sum(sizes), 0.8) / nmc_update(spec, acc, sizes, 0.8).time_s \
        > gpu / base.time_s


def test_nmc_needs_a_device_with_near_bank_compute() -> None:
    w = load_workload(None, ["run.kind='train'", "device.preset='t3-gpu'",
                             "optimizer.on='nmc'", "run.numerics='off'"])
    with pytest.raises(ConfigError, match=r"optimizer.on='nmc': needs near-bank compute: "
                                          r"device t3-gpu has no \[nmc\] section"):
        validate(w, 1)
    with pytest.raises(ConfigError, match=r"optimizer.on='cpu': choose one of"):
        load_workload(None, ["optimizer.on='cpu'"])


def _train(out: Path, on: str) -> None:
    tp = MPI.COMM_WORLD.Get_size()
    sets = ["run.kind='train'", "run.iterations=2", f"parallel.tp={tp}", "parallel.dp=1",
            "model.preset='tiny'", "device.preset='mi100'", "optimizer.name='lamb'",
            "run.numeric_dtype='fp64'", "train.check_reference=true", f"optimizer.on='{on}'"]
    run_workload(None, sets, str(out), [], world=MPI.COMM_WORLD)
    MPI.COMM_WORLD.Barrier()


@pytest.mark.mpi(min_size=1)
def test_the_update_on_nmc_computes_the_same_and_is_charged_as_nmc(mpi_tmp_path: Path) -> None:
    """The reference check passes with the update on NMC; only the optim ops change."""
    _train(mpi_tmp_path / "gpu", "gpu")
    _train(mpi_tmp_path / "nmc", "nmc")
    a, b = (load(mpi_tmp_path / x).ranks[0] for x in ("gpu", "nmc"))
    na, nb = set(map(str, a.names)), set(map(str, b.names))
    assert "optim.lamb.stage1" in na and "optim.lamb.stage1" not in nb
    assert {"optim.nmc.stage1", "optim.nmc.norms", "optim.nmc.stage2",
            "optim.nmc.norms.reduce", "optim.grad_norm"} <= nb
    not_optim = [n for n in na if not n.startswith("optim.")]
    for name in not_optim:                    # forward and backward are charged alike
        da = a.events["t_end"][a.names == name] - a.events["t_start"][a.names == name]
        db = b.events["t_end"][b.names == name] - b.events["t_start"][b.names == name]
        assert np.allclose(da, db, rtol=1e-9, atol=0), name

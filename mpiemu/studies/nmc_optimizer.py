"""`mpiemu report nmc_optimizer`: thesis (seed 003) chapter 6, the LAMB and Adam updates on
near-bank compute (NMC) against the GPU, regenerated from `devices/nmc.py` and emulated runs.

* `updates.csv`: per model and optimizer, the update on the GPU (its bytes at 100 / 90 / 80%
  of peak HBM bandwidth, thesis 6.4) and on NMC (`devices.nmc.nmc_update`, temporary storage x
  0.5 .. 8 of the preset's), DRAM-interface bytes per parameter both ways;
* `e2e.csv`: BERT-Large training iterations on the MI100 preset, one rank, timing only,
  `optimizer.on = "gpu"` and `"nmc"` (`workloads/bert-large-mi100.toml`): iteration time,
  the update's share and the speedup (thesis 6.4: 9-20%);
* `speedup.png`; README.md with every figure beside the thesis's (`nmc_optimizer.toml`).
Golden test: `updates.csv` in full and the Ph1-B32-FP32 rows of `e2e.csv` (two runs).
"""
from __future__ import annotations

import math
import tempfile
from pathlib import Path

from ..devices.caps import set_path
from ..devices.nmc import (Access, NmcUpdate, gpu_update_s, nmc_update, update_accesses,
                      update_bytes)
from ..devices.presets import load_device
from ..devices.specs import DeviceSpec, dtype_bytes
from ..model.presets import load_model_preset
from ..model.tensor_parallel import local_params
from . import runs as launch
from ..workloads import DIR as WORKLOADS_DIR
from .common import Golden, Row, load_figures

WORKLOAD = WORKLOADS_DIR / "bert-large-mi100.toml"


def tensors(model: str, tp: int) -> list[int]:
    """Parameter counts of one TP rank's tensors (each spread over all banks, 6.2.2)."""
    cfg = load_model_preset(model).config.for_tp(tp)
    return [lp.size for lp in local_params(cfg, tp)]


def _column_share(spec: DeviceSpec, acc: list[Access], sizes: list[int],
                  upd: NmcUpdate) -> float:
    """Share of the banks' NMC time spent on column accesses (the rest: row cycles)."""
    nmc = spec.nmc
    assert nmc is not None
    cols = sum(math.ceil(math.ceil(t / nmc.banks) * a.bytes / nmc.column_bytes)
               for a in acc if a.phase != "grad_norm" for t in sizes) * nmc.t_ccd_s
    return cols / sum(upd.phase_s.values())


def update_rows() -> list[Row]:
    """GPU vs NMC update for every (model, optimizer), GPU utilisation and TS size."""
    fig = load_figures("nmc_optimizer")
    base = load_device(str(fig["device"].value))
    assert base.nmc is not None
    e = dtype_bytes(str(fig["emulated_dtype"].value))
    rows: list[Row] = []
    for m in fig["models"].value:
        sizes = tensors(m["model"], m["tp"])
        n = sum(sizes)
        acc = update_accesses(m["optimizer"], e)
        for scale in fig["ts_scales"].value:
            spec = set_path(base, "nmc.ts_bytes", base.nmc.ts_bytes * scale)
            for util in fig["gpu_utils"].value:
                gpu, upd = gpu_update_s(spec, acc, n, util), nmc_update(spec, acc, sizes, util)
                rows.append({
                    "model": m["model"], "optimizer": m["optimizer"], "tp": m["tp"],
                    "params": n, "tensors": len(sizes), "ts_bytes": int(spec.nmc.ts_bytes),  # type: ignore[union-attr]
                    "gpu_util": float(util), "gpu_ms": gpu * 1e3, "nmc_ms": upd.time_s * 1e3,
                    "nmc_gpu_part_ms": sum(upd.gpu_s.values()) * 1e3,
                    "speedup": gpu / upd.time_s,
                    "gpu_bytes_per_param": float(update_bytes(acc, 1)),
                    "nmc_interface_bytes_per_param": upd.interface_bytes / n,
                    "traffic_reduction": update_bytes(acc, n) / upd.interface_bytes,
                    "column_share": _column_share(spec, acc, sizes, upd)})
    return rows


def _optim_ms(run_dir: Path) -> tuple[float, float]:
    """(iteration ms, update ms) of a one-rank run, read back from its trace."""
    from ..analysis import load  # noqa: PLC0415
    rt = load(run_dir).ranks[0]
    ev = rt.events
    dur = ev["t_end"] - ev["t_start"]
    upd = sum(float(d) for d, name, cat in zip(dur, rt.names, rt.cats)
              if str(name).startswith("optim.") and cat == "compute")
    return float(ev["t_end"].max() - ev["t_start"].min()) * 1e3, upd * 1e3


def e2e_rows(runs: Path, labels: tuple[str, ...] = ()) -> list[Row]:
    """BERT-Large iterations with the update on the GPU and on NMC (emulated runs)."""
    fig = load_figures("nmc_optimizer")
    rows: list[Row] = []
    for cfg in fig["bert_runs"].value:
        if labels and cfg["label"] not in labels:
            continue
        res: dict[str, tuple[float, float]] = {}
        for on in ("gpu", "nmc"):
            out = runs / f"{cfg['label']}-{on}"
            launch.run(1, WORKLOAD, [f"model.seq_len={cfg['seq_len']}",
                                     f"train.global_batch={cfg['global_batch']}",
                                     f"run.emulated_dtype='{cfg['dtype']}'",
                                     f"optimizer.on='{on}'"], out)
            res[on] = _optim_ms(out)
        (it_g, up_g), (it_n, up_n) = res["gpu"], res["nmc"]
        rows.append({"run": cfg["label"], "iteration_gpu_ms": it_g, "update_gpu_ms": up_g,
                     "update_share_gpu": up_g / it_g, "iteration_nmc_ms": it_n,
                     "update_nmc_ms": up_n, "update_speedup": up_g / up_n,
                     "e2e_speedup": it_g / it_n - 1})
    return rows


def golden() -> list[Golden]:
    """updates.csv in full; e2e.csv's Ph1-B32-FP32 rows (two one-rank runs)."""
    with tempfile.TemporaryDirectory(prefix="mpiemu-nmc-") as tmp:
        e2e = e2e_rows(Path(tmp), ("Ph1-B32-FP32",))
    return [Golden("updates.csv", update_rows()),
            Golden("e2e.csv", e2e, lambda r: r["run"] == "Ph1-B32-FP32")]

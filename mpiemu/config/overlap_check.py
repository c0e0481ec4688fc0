"""Checks that the devices of a run can play the overlap strategies it asks for."""
from __future__ import annotations

from typing import Sequence

from .workload import Workload, resolve_device
from .errors import ConfigError


def check_overlap_devices(w: Workload, strategies: Sequence[str], field: str,
                          comm_cus: Sequence[int] = ()) -> None:
    """Strategies past `ideal` need a GPU preset with the overlap-model parameters; ranks
    playing different devices need a fixed `overlap.pieces` (chunks must cut alike);
    `sw-overlap`'s communication kernel (`comm_cus`, default `overlap.comm_cus`) must leave
    the GEMM some compute units."""
    needs_params = [s for s in strategies if s not in ("sequential", "ideal")]
    presets = w.device.rank_presets or (w.device.preset,)
    for r in range(len(presets)):
        spec = resolve_device(w, r)
        if needs_params and spec.kind != "gpu":
            raise ConfigError(field, list(needs_params),
                              f"model a GPU memory system; device {spec.name} is a {spec.kind}")
        if needs_params and spec.t3 is None:
            raise ConfigError("device.preset", spec.name, "has no [t3] section with the "
                              "overlap-model parameters (see mpiemu/devices/presets/t3-gpu.toml)")
        for cus in (comm_cus or (w.overlap.comm_cus,)) if "sw-overlap" in strategies else ():
            if cus >= spec.compute_units:
                raise ConfigError("sublayers.sw_comm_cus" if comm_cus else "overlap.comm_cus",
                                  cus, f"fewer than the {spec.compute_units} compute units of "
                                  f"{spec.name} (sw-overlap's GEMM runs on the others)")
    if len(set(presets)) > 1 and w.overlap.pieces == 0:
        raise ConfigError("overlap.pieces", 0, "must be > 0 when ranks play different devices "
                          "(the per-stage default would cut chunks differently per rank)")

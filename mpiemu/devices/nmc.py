"""Optimizer updates on near-bank compute (NMC) against the GPU (thesis ch. 6).

An update is a list of array accesses per parameter (`update_accesses`): Adam reads g, m, v,
w and writes m, v, w; LAMB (thesis Fig. 6.2: "reads and writes 13 parameters") adds the
global gradient norm (read g), the update u it writes in stage 1 and reads twice more (the
per-tensor norms, stage 2). The same list is charged two ways:

* GPU (`gpu_update_s`): every byte crosses the DRAM interface at `util` x the peak
  bandwidth. `util` = 1 is the thesis's ideal GPU (6.4: "only (minimal) data reads and
  writes ... at peak HBM bandwidth"); 0.9 and 0.8 its realistic ones;
* NMC (`nmc_update`): the global gradient norm stays on the GPU (6.3: "we take the latter
  approach [reduction by the host GPU] for the L2 Normalization of all gradients"), every
  other access runs on the ALUs of all banks at once (6.2.2, all-bank mode). Each tensor is
  spread over every bank (6.2.2: page-aligned data mapping); per bank an access streams its
  slice a temporary-storage chunk at a time, paying a DRAM row cycle per chunk
  (`chunk_s`); the per-tensor norms end with one GPU round trip over the banks' partial
  sums (6.3). The data crossing the DRAM interface is the gradient read and the partial
  sums.

ASSUMPTIONs beyond the thesis text: all banks activate together (HBM-PIM's all-bank mode, no
four-activation window), the ALU evaluates LAMB's square root and division in its pipeline
under the column accesses (the thesis lists add, mul, shift, scale: a Newton reciprocal
square root needs only those), command-bus bandwidth is not a limit.
"""
from __future__ import annotations

import math
from typing import Iterable, NamedTuple

from .specs import DeviceSpec, NmcSpec

MASTER_BYTES = 4        # fp32 master weights and optimizer states (thesis 4.2.1)
OPTIMIZERS = ("adam", "lamb")


class Access(NamedTuple):
    """One pass over one array: `bytes` per parameter, read or written, in update `phase`."""

    phase: str
    array: str
    bytes: int
    write: bool = False


def update_accesses(name: str, grad_bytes: int, copy_bytes: int = 0,
                    global_norm: bool = True) -> list[Access]:
    """The DRAM accesses of one Adam or LAMB update per parameter (fp32 states; gradients in
    the emulated dtype; `copy_bytes` > 0: the narrower working copy of w written too)."""
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer={name!r}; choose one of {list(OPTIMIZERS)}")
    m4 = MASTER_BYTES
    out = [Access("grad_norm", "g", grad_bytes)] if global_norm or name == "lamb" else []
    first = "stage1" if name == "lamb" else "adam"
    out += [Access(first, a, b) for a, b in (("g", grad_bytes), ("m", m4), ("v", m4),
                                              ("w", m4))]
    out += [Access(first, a, m4, True) for a in (("m", "v", "u") if name == "lamb"
                                                 else ("m", "v", "w"))]
    if name == "lamb":
        out += [Access("norms", "w", m4), Access("norms", "u", m4),
                Access("stage2", "u", m4), Access("stage2", "w", m4),
                Access("stage2", "w", m4, True)]
    if copy_bytes:
        out.append(Access("stage2" if name == "lamb" else "adam", "w_copy", copy_bytes, True))
    return out


def update_bytes(accesses: Iterable[Access], params: float) -> float:
    """DRAM bytes of an update of `params` parameters."""
    return params * sum(a.bytes for a in accesses)


def gpu_update_s(spec: DeviceSpec, accesses: Iterable[Access], params: float,
                 util: float = 1.0) -> float:
    """The update's bytes at `util` x peak DRAM bandwidth (no launches: the thesis's GPU)."""
    return update_bytes(accesses, params) / (spec.dram_bw_bytes_per_s * util)


def chunk_s(nmc: NmcSpec, nbytes: float, write: bool) -> float:
    """One bank streaming `nbytes` (one chunk, within one row) through its ALU: activate,
    column accesses, then read-to-precharge or write latency + recovery, then precharge."""
    cols = math.ceil(nbytes / nmc.column_bytes)
    tail = nmc.t_wl_s + nmc.t_wr_s if write else nmc.t_rtp_s
    return max(nmc.t_ras_s, nmc.t_rcd_s + cols * nmc.t_ccd_s + tail) + nmc.t_rp_s


def bank_access_s(nmc: NmcSpec, tensor_params: int, nbytes: int, write: bool) -> float:
    """One access of one tensor on NMC: its slice on every bank, chunk by chunk."""
    per_bank = math.ceil(tensor_params / nmc.banks) * nbytes
    chunk = min(nmc.ts_bytes, nmc.row_bytes)
    full, rest = divmod(per_bank, chunk)
    return full * chunk_s(nmc, chunk, write) + (chunk_s(nmc, rest, write) if rest else 0.0)


def _nmc(spec: DeviceSpec) -> NmcSpec:
    if spec.nmc is None:
        raise ValueError(f"device {spec.name} has no [nmc] section (near-bank compute); "
                         "choose a preset that has one (mpiemu devices lists sections)")
    return spec.nmc


def phase_s(spec: DeviceSpec, accesses: Iterable[Access], phase: str,
            tensors: Iterable[int]) -> float:
    """NMC time of one update phase over `tensors` (parameter counts), all banks at once."""
    nmc, sizes = _nmc(spec), list(tensors)
    return sum(bank_access_s(nmc, t, a.bytes, a.write) for a in accesses if a.phase == phase
               for t in sizes)


def partial_sums(spec: DeviceSpec, n_norms: int) -> tuple[float, float]:
    """(GPU time, interface bytes) of reducing `n_norms` per-bank partial sums (thesis 6.3),
    the GPU streaming them at its achievable bandwidth."""
    nmc = _nmc(spec)
    nbytes = float(n_norms * nmc.banks * MASTER_BYTES)
    return nmc.host_sync_s + nbytes / spec.dram_stream_bw, nbytes


class NmcUpdate(NamedTuple):
    """Time and DRAM-interface traffic of an update on NMC, per phase."""

    phase_s: dict[str, float]          # NMC work per phase (all banks in parallel)
    gpu_s: dict[str, float]            # GPU work per phase (gradient norm, partial sums)
    interface_bytes: float             # bytes crossing the DRAM interface (GPU <-> DRAM)

    @property
    def time_s(self) -> float:
        return sum(self.phase_s.values()) + sum(self.gpu_s.values())


def nmc_update(spec: DeviceSpec, accesses: list[Access], tensors: list[int],
               util: float = 1.0) -> NmcUpdate:
    """The whole update of `tensors` with NMC, the GPU's gradient norm at `util` x peak."""
    params = sum(tensors)
    gpu: dict[str, float] = {}
    moved = 0.0
    for a in accesses:
        if a.phase == "grad_norm":          # on the GPU (thesis 6.3)
            gpu[a.phase] = gpu.get(a.phase, 0.0) + gpu_update_s(spec, [a], params, util)
            moved += params * a.bytes
    phases = dict.fromkeys(a.phase for a in accesses if a.phase != "grad_norm")
    on_nmc = {p: phase_s(spec, accesses, p, tensors) for p in phases}
    if "norms" in on_nmc:                   # ||w||^2 and ||u||^2 per tensor and bank
        gpu["norms.reduce"], nbytes = partial_sums(spec, 2 * len(tensors))
        moved += nbytes
    return NmcUpdate(on_nmc, gpu, moved)

"""Streaming multiprocessors shared between the compute stream and collective kernels.

NCCL runs a collective as one kernel of one thread block per channel (NCCL src/enqueue.cc,
ncclLaunchKernel: grid = the plan's channel count), each block of 512-640 threads, which
holds an SM while it runs (ASSUMPTION: its threads and registers leave no room for a GEMM's
CTA beside it). A GEMM that runs meanwhile on the compute stream gets the SMs that are left:
the thesis measures a GEMM with 64 of 80 CUs about 21% slower while an all-reduce holds the
other 16 (seed 003, 8.2.2, Fig. 8.4), which is why Megatron-LM's asynchronous gradient
all-reduce does not hide for free under the weight-gradient GEMM.

`SmShare` keeps the spans during which this rank's collective kernels hold SMs; `stretch`
gives how long a kernel that starts at t0 runs: at its full rate where nothing is held, at
its rate on the SMs left where something is (a fluid model, piecewise exact, deterministic).
"""
from __future__ import annotations

from typing import Callable, NamedTuple


class Held(NamedTuple):
    """SMs a collective kernel holds from t_start to t_end (emulated seconds)."""

    t_start: float
    t_end: float
    sms: int


class SmShare:
    """The SMs this rank's collective kernels hold over emulated time."""

    def __init__(self) -> None:
        self._held: list[Held] = []

    def hold(self, t_start: float, t_end: float, sms: int) -> None:
        """A collective kernel holds `sms` SMs over [t_start, t_end)."""
        if sms > 0 and t_end > t_start:
            self._held.append(Held(t_start, t_end, sms))

    def stretch(self, t0: float, full_s: float, shared_s: Callable[[int], float],
                forget_before: bool = True) -> float:
        """Duration of a kernel starting at t0 that takes `full_s` alone and
        `shared_s(h)` while collectives hold h SMs. `forget_before`: nothing will start
        before t0 again (the compute stream places in issue order), so spans that end by
        then are dropped."""
        if not self._held:
            return full_s
        live = [h for h in self._held if h.t_end > t0]
        if forget_before:
            self._held = live
        if not live:
            return full_s
        edges = sorted({t0, *(h.t_start for h in live if h.t_start > t0),
                        *(h.t_end for h in live)})
        done = 0.0                        # fraction of the kernel's work finished
        for a, b in zip(edges, edges[1:]):
            held = sum(h.sms for h in live if h.t_start <= a < h.t_end)
            d = shared_s(held) if held else full_s
            if done + (b - a) / d >= 1.0:
                return a + (1.0 - done) * d - t0
            done += (b - a) / d
        return edges[-1] + (1.0 - done) * full_s - t0

"""Workload section of Sunway ranks: [sunway] (SWA 2.3 modes, SWA 3 kernels, SWF scheduling)."""
from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError

MODES = ("all-shared", "single-cg")
ATTENTION_KERNELS = ("swattention", "standard")
SCHEDULERS = ("intra", "opt2", "ka")
BLOCK_POLICIES = ("paper", "search")
MODE_PRESETS = {"all-shared": "sw26010pro", "single-cg": "sw26010pro-cg"}


@dataclass(frozen=True)
class SunwaySection:
    """Execution mode, attention kernel and inter-op scheduler of SW26010pro ranks.

    mode: "all-shared" (a rank = a processor, 6 CGs, 96 GB) or "single-cg" (a rank = a CG,
    16 GB); it must match the device preset's CG count. attention: SWattention or the standard
    operator chain (which can run out of memory). scheduler: SwFormer's intra-op tiling alone,
    OPT2 (independent GEMM pairs) or KA (attention's idle CGs filled by BFS-found ops).
    """

    mode: str = "all-shared"
    attention: str = "swattention"
    scheduler: str = "intra"
    blocks: str = "paper"
    tile_fusion: bool = False

    def __post_init__(self) -> None:
        for name, allowed in (("mode", MODES), ("attention", ATTENTION_KERNELS),
                              ("scheduler", SCHEDULERS), ("blocks", BLOCK_POLICIES)):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"sunway.{name}", getattr(self, name), allowed)

    def check_device(self, kind: str, compute_units: int) -> None:
        """The preset must be a Sunway one whose CG count matches the mode."""
        if kind != "sunway":
            raise ConfigError("device.preset", kind,
                              f"a Sunway preset for [sunway] settings, e.g. "
                              f"{sorted(MODE_PRESETS.values())}")
        want = 1 if self.mode == "single-cg" else None
        if (want == 1) != (compute_units == 1):
            raise ConfigError("sunway.mode", self.mode,
                              f"the preset has {compute_units} CG(s); use "
                              f"{MODE_PRESETS[self.mode]!r} for {self.mode} mode")

"""Workload section [run]: what to run and how (kind, iterations, seed, numerics and the
precision they compute in, the dtype timing charges, folding)."""
from __future__ import annotations

from dataclasses import dataclass

from ..devices.specs import DTYPE_BYTES
from .errors import ConfigError

KINDS = ("collectives", "train", "sublayers", "layer_sweep")
# fp32 / fp64: exact numpy; bf16, fp16: every GEMM as tensor cores run it (`mpiemu.precision`;
# fp16 with loss scaling)
NUMERIC_DTYPES = ("fp32", "fp64", "bf16", "fp16")


@dataclass(frozen=True)
class RunSection:
    """What to run and how: kind, iterations, seed, real numerics or shapes only."""

    kind: str = "collectives"
    seed: int = 0
    iterations: int = 1
    numerics: str = "on"             # "on": real values; "off": shapes and timestamps only
    numeric_dtype: str = "fp32"      # precision of the real values when numerics are on
    emulated_dtype: str = "fp16"     # dtype the timing and byte model charges
    numerics_budget_tflop: float = 2.0   # real math a rank may do before a run is refused
    fold: str = "auto"               # one MPI rank per stage when launched so (`run.fold`)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError("run.kind", self.kind, KINDS)
        if self.fold not in ("auto", "on", "off"):
            raise ConfigError("run.fold", self.fold, ("auto", "on", "off"))
        if self.fold == "on" and self.numerics == "on":
            raise ConfigError("run.fold", self.fold, "\"off\" or \"auto\" with run.numerics "
                              "= \"on\" (folding mirrors timing only: set run.numerics = "
                              "\"off\")")
        if not self.numerics_budget_tflop > 0:
            raise ConfigError("run.numerics_budget_tflop", self.numerics_budget_tflop,
                              "a budget > 0 (TFLOP of real math per rank)")
        if self.iterations < 1:
            raise ConfigError("run.iterations", self.iterations, "an integer >= 1")
        if not 0 <= self.seed < 2 ** 32:
            raise ConfigError("run.seed", self.seed, "an integer in 0..2**32 - 1 (numpy's "
                              "seeds)")
        if self.numerics not in ("on", "off"):
            raise ConfigError("run.numerics", self.numerics, ("on", "off"))
        if self.numeric_dtype not in NUMERIC_DTYPES:
            raise ConfigError("run.numeric_dtype", self.numeric_dtype, NUMERIC_DTYPES)
        if self.numeric_dtype in ("bf16", "fp16") and self.kind != "train":
            raise ConfigError("run.numeric_dtype", self.numeric_dtype, "fp32 or fp64 for "
                              f"run.kind={self.kind!r} (half-precision numerics run a "
                              "training step's GEMMs: run.kind='train')")
        if self.emulated_dtype not in DTYPE_BYTES or self.emulated_dtype == "fp8":
            raise ConfigError("run.emulated_dtype", self.emulated_dtype,
                              f"{sorted(set(DTYPE_BYTES) - {'fp8'})} (FP8 GEMMs: [fp8] recipe)")

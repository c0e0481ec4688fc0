"""Workload sections of GEMM / collective overlap: [overlap] and the [sublayers] sweep."""
from __future__ import annotations

from dataclasses import dataclass

from ..overlap.strategy import MODES, STRATEGIES, Overlap
from .errors import ConfigError

# Thesis 8.5.1: the sliced sub-layers that need an all-reduce, and the K of their GEMM in
# multiples of H (before slicing by TP): OP and FC-2 forward, FC-1 and IP backward (dgrad).
SUBLAYER_K: dict[str, int] = {"OP-fwd": 1, "FC-2-fwd": 4, "FC-1-bwd": 4, "IP-bwd": 3}


# pieces per ring chunk: MAX_PIECES x (TP - 1) steps x 2 lanes stays near 10^6 messages per
# GEMM at the thesis's largest TP (256, ch. 5)
MAX_PIECES = 2048


@dataclass(frozen=True)
class OverlapSection:
    """How every TP GEMM + collective pair is scheduled (thesis 8.4.3 configurations)."""

    strategy: str = "sequential"
    bidirectional: bool = False
    comm_cus: int = 16               # sw-overlap: CUs the communication kernel takes
    pieces: int = 0                  # sub-chunks per ring chunk (0: one per GEMM stage)

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ConfigError("overlap.strategy", self.strategy, STRATEGIES)
        if self.comm_cus < 1:
            raise ConfigError("overlap.comm_cus", self.comm_cus, "an integer >= 1")
        if not 0 <= self.pieces <= MAX_PIECES:
            raise ConfigError("overlap.pieces", self.pieces, f"an integer in 0..{MAX_PIECES} "
                              "(0: per stage; each piece is a message per lane and ring step "
                              "and a GEMM slice: more would emulate over a million messages "
                              "per GEMM at TP 256)")

    def to_overlap(self, strategy: str | None = None, comm_cus: int | None = None) -> Overlap:
        return Overlap(strategy=strategy or self.strategy, bidirectional=self.bidirectional,
                       comm_cus=comm_cus or self.comm_cus, pieces=self.pieces)


@dataclass(frozen=True)
class SublayerModel:
    """A transformer the sweep slices: hidden size and tokens (= sequence x batch)."""

    name: str = "mega-gpt2"
    hidden: int = 3072
    tokens: int = 16384

    def __post_init__(self) -> None:
        if self.hidden < 1 or self.tokens < 1:
            raise ConfigError(f"sublayers.models[{self.name}]",
                              f"hidden={self.hidden}, tokens={self.tokens}", "both >= 1")


# Thesis Table 8.2 / 8.4.2: Mega-GPT-2 H=3072 with 16K tokens, T-NLG H=4256 with 8K tokens.
THESIS_MODELS = (SublayerModel("mega-gpt2", 3072, 16384), SublayerModel("t-nlg", 4256, 8192))


@dataclass(frozen=True)
class SublayersSection:
    """A sweep of TP sub-layers (OP-fwd, FC-2-fwd, FC-1-bwd, IP-bwd) over strategies."""

    models: tuple[SublayerModel, ...] = THESIS_MODELS
    sublayers: tuple[str, ...] = tuple(SUBLAYER_K)
    strategies: tuple[str, ...] = STRATEGIES
    sw_comm_cus: tuple[int, ...] = (16, 8)   # sw-overlap splits run (thesis Fig. 8.4)
    mode: str = "all_reduce"                 # GEMM -> RS -> AG, as the thesis's sub-layers

    def __post_init__(self) -> None:
        for i, s in enumerate(self.sublayers):
            if s not in SUBLAYER_K:
                raise ConfigError(f"sublayers.sublayers[{i}]", s, tuple(SUBLAYER_K))
        for i, s in enumerate(self.strategies):
            if s not in STRATEGIES:
                raise ConfigError(f"sublayers.strategies[{i}]", s, STRATEGIES)
        if "sequential" not in self.strategies:
            raise ConfigError("sublayers.strategies", list(self.strategies),
                              "must include 'sequential' (speedups are relative to it)")
        for i, c in enumerate(self.sw_comm_cus):
            if c < 1:
                raise ConfigError(f"sublayers.sw_comm_cus[{i}]", c, "an integer >= 1")
        if self.mode not in MODES:
            raise ConfigError("sublayers.mode", self.mode, MODES)
        if not self.models:
            raise ConfigError("sublayers.models", [], "at least one model")

    def overlaps(self, base: OverlapSection) -> list[Overlap]:
        """Every strategy to run, sw-overlap once per CU split."""
        out = []
        for s in self.strategies:
            cus = self.sw_comm_cus if s == "sw-overlap" else (base.comm_cus,)
            out += [base.to_overlap(s, c) for c in cus]
        return out

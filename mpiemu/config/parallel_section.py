"""The `[parallel]` section: the process grid, context parallelism and the pipeline schedule."""
from __future__ import annotations

from dataclasses import dataclass

from ..model.pipeline_schedules import SCHEDULES
from ..model.pipeline_split import LayerSplit
from ..model.config import braces, divisors
from .errors import ConfigError

CP_COMMS = ("p2p", "all_gather")     # Megatron-Core --cp-comm-type (a2a not modelled)
MAX_DEVICES = 1 << 17   # emulator limit: 131072 emulated devices, above any cluster's GPUs


@dataclass(frozen=True)
class ParallelSection:
    """The TP x CP x DP x PP grid (their product must equal the number of ranks, Megatron-
    Core's rank order tp-cp-dp-pp), context parallelism's attention (`cp_comm`: "p2p", the
    KV ring overlapped with the attention of the block in hand; "all_gather", K and V
    gathered first, as Llama 3 trained long contexts) and the pipeline schedule: `gpipe`,
    `1f1b` or `interleaved` with `virtual_stages` model chunks per stage (Megatron-LM
    --num-layers-per-virtual-pipeline-stage = layers / (pp v))."""

    tp: int = 1
    dp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1                      # expert parallelism: experts split over ep ranks of a stage
    # expert tensor parallelism: each expert's FFN split over etp ranks (Megatron-Core
    # --expert-tensor-parallel-size; Megatron-LM defaults it to tp, here it is stated)
    etp: int = 1
    cp_comm: str = "p2p"
    sequence_parallel: bool = False  # RS after row-parallel, AG before column-parallel GEMMs
    schedule: str = "1f1b"
    virtual_stages: int = 1
    # uneven stages (Megatron-Core --decoder-first/last-pipeline-num-layers; 0: even)
    first_stage_layers: int = 0
    last_stage_layers: int = 0
    # the embedding / the loss counted as one layer of the first / last virtual stage
    # (--account-for-embedding-in-pipeline-split, --account-for-loss-in-pipeline-split)
    embedding_in_split: bool = False
    loss_in_split: bool = False

    def __post_init__(self) -> None:
        for name in ("tp", "dp", "pp", "cp", "ep", "etp", "virtual_stages"):
            if getattr(self, name) < 1:
                raise ConfigError(f"parallel.{name}", getattr(self, name), "an integer >= 1")
        for name in ("first_stage_layers", "last_stage_layers"):
            if getattr(self, name) < 0:
                raise ConfigError(f"parallel.{name}", getattr(self, name),
                                  "an integer >= 0 (0: as the other stages)")
        self._check_experts()
        if self.devices > MAX_DEVICES:
            raise ConfigError(self.grid_field, self.grid_value,
                              f"at most {MAX_DEVICES} emulated devices (a folded job still "
                              "lists every device's place)")
        if self.cp_comm not in CP_COMMS:
            raise ConfigError("parallel.cp_comm", self.cp_comm, CP_COMMS)
        if self.schedule not in SCHEDULES:
            raise ConfigError("parallel.schedule", self.schedule, SCHEDULES)
        if self.schedule == "interleaved" and self.virtual_stages < 2:
            raise ConfigError("parallel.virtual_stages", self.virtual_stages,
                              "an integer >= 2 with parallel.schedule = 'interleaved'")
        if self.schedule != "interleaved" and self.virtual_stages != 1:
            raise ConfigError("parallel.virtual_stages", self.virtual_stages,
                              "1 unless parallel.schedule = 'interleaved'")

    def _check_experts(self) -> None:
        """EP x ETP regroups a stage's ranks: it must divide them (Megatron-Core's expert
        RankGenerator: tp*cp*dp = etp*ep*edp)."""
        stage = self.tp * self.cp * self.dp
        if self.etp == 1 and stage % self.ep:
            raise ConfigError("parallel.ep", self.ep, f"does not divide a stage's tp*cp*dp = "
                              f"{stage} ranks (expert parallel x expert data parallel); "
                              f"choose ep in {braces(divisors(stage))}")
        if stage % (self.ep * self.etp):
            raise ConfigError("parallel.ep*parallel.etp", f"{self.ep}*{self.etp}="
                              f"{self.ep * self.etp}", f"does not divide a stage's tp*cp*dp = "
                              f"{stage} ranks (expert TP x expert parallel x expert data "
                              f"parallel); choose ep*etp in {braces(divisors(stage))}")

    @property
    def split(self) -> LayerSplit:
        """How the pipeline stages divide the layers."""
        return LayerSplit(self.first_stage_layers, self.last_stage_layers,
                          self.embedding_in_split, self.loss_in_split)

    @property
    def devices(self) -> int:
        """Emulated devices of the grid."""
        return self.tp * self.cp * self.dp * self.pp

    @property
    def grid_field(self) -> str:
        """The grid's product as a refusal names it (CP only when used)."""
        return "parallel.tp*parallel.cp*parallel.dp*parallel.pp" if self.cp > 1 else \
            "parallel.tp*parallel.dp*parallel.pp"

    @property
    def grid_value(self) -> str:
        if self.cp > 1:
            return f"{self.tp}*{self.cp}*{self.dp}*{self.pp}={self.devices}"
        return f"{self.tp}*{self.dp}*{self.pp}={self.devices}"

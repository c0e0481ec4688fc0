"""The local sizes of one rank: what a TP rank of one micro-batch holds (Megatron's layout).

Heads, the FC width and the vocabulary are split contiguously over TP (thesis 2.3.3, 4.5.1);
under sequence parallelism the residual stream's rows are split too (Korthikanti et al.
2022). Rows are sequence x micro-batch, sequence first.
"""
from __future__ import annotations

from typing import NamedTuple

from .config import ModelConfig


class Dims(NamedTuple):
    """Local sizes of one rank: rows are sequence x micro-batch, sequence first."""

    seq: int
    batch: int                 # sequences of this DP rank
    hidden: int
    heads: int                 # heads of this TP rank
    head_dim: int
    ffn: int                   # FC width of this TP rank
    vocab: int                 # vocabulary rows of this TP rank
    tp: int
    sp: bool
    groups: int = 0            # KV heads this rank attends with (0: as many as its heads)
    gathered: int = 0          # TP exceeds the KV heads: the whole grouped QKV output's
                               # columns, all-gathered (this rank's GEMM makes 1/tp of them)
    cp: int = 1                # context parallelism: `seq` is this rank's share, 1/cp

    @property
    def rows(self) -> int:
        return self.seq * self.batch

    @property
    def shard_rows(self) -> int:
        """Rows of the residual stream this rank holds (its sequence slice under SP)."""
        return self.rows // self.tp if self.sp else self.rows

    @property
    def attn_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_heads(self) -> int:
        """KV heads this rank attends with (its group's one, when they are replicated)."""
        return self.groups or self.heads

    @property
    def qkv_width(self) -> int:
        """Columns of this rank's QKV GEMM: its query and KV heads, or its even slice of the
        grouped QKV when that is all-gathered."""
        if self.gathered:
            return self.gathered // self.tp
        return (self.heads + 2 * self.kv_heads) * self.head_dim


def make_dims(cfg: ModelConfig, tp: int, micro_batch: int, sp: bool, cp: int = 1) -> Dims:
    """Local sizes of one micro-batch on a TP rank (cfg already padded for tp); with
    context parallelism the rank holds 1/cp of the sequence."""
    replicated = cfg.groups < tp                 # each KV head serves several ranks
    groups = 1 if replicated else cfg.groups // tp
    gathered = (cfg.heads + 2 * cfg.groups) * cfg.head_dim if replicated else 0
    return Dims(seq=cfg.seq_len // cp, batch=micro_batch, hidden=cfg.hidden,
                heads=cfg.heads // tp, head_dim=cfg.head_dim, ffn=cfg.ffn_hidden // tp,
                vocab=cfg.padded_vocab // tp, tp=tp, sp=sp and tp > 1,
                groups=0 if groups == cfg.heads // tp else groups, gathered=gathered, cp=cp)

"""The transformer being trained, resolved from a preset plus overrides (no MPI, no arrays).

Shapes follow Megatron (thesis 2.3.3, 4.5.1): heads split contiguously over TP ranks,
FC width `ffn_hidden`, a vocabulary padded so that every TP rank holds an equal slice.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

class FieldError(ValueError):
    """A setting out of range (model, optimizer): names the field, the value, what is allowed."""

    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field, self.value, self.allowed = field, value, allowed
        super().__init__(f"{field}={value!r}: {allowed}")


NORMS = ("pre", "post")                 # GPT-2/3 pre-LN, BERT post-LN ("Add & Norm")
MASKS = ("causal", "bidirectional")     # GPT decoder, BERT encoder
# baseline: materialized S x S scores and a softmax kernel; sd / sdf: that softmax recomposed
# (seed 004), unfused / fused into the GEMMs; flash: FlashAttention-2 (online softmax)
ATTENTIONS = ("baseline", "sd", "sdf", "flash")
ATTENTION_ALIASES = {"dense": "baseline", "blockwise": "flash"}   # the names before issue 10


# Bounds on what a run could ever build or emulate (10x the largest published models:
# PaLM 118 layers, H = 18432, FFN 73728, 256K vocabularies, 1M-token contexts).
MAX_SIZE = {"hidden": 1 << 20, "layers": 10_000, "heads": 1 << 16, "ffn_hidden": 1 << 22,
            "vocab": 1 << 24, "seq_len": 1 << 24, "attention_block": 1 << 24,
            "vocab_multiple": 1 << 16}


@dataclass(frozen=True)
class ModelConfig:
    """A GPT- or BERT-style transformer; every size in elements."""

    name: str
    hidden: int
    layers: int
    heads: int
    ffn_hidden: int
    vocab: int                       # tokens of the tokenizer
    seq_len: int
    norm: str = "pre"
    attention_mask: str = "causal"
    attention: str = "baseline"
    attention_block: int = 64        # block width of blockwise attention (flash, sd, sdf)
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    layernorm_eps: float = 1e-5
    init_std: float = 0.02
    vocab_multiple: int = 128        # Megatron --make-vocab-size-divisible-by
    vocab_padded: int = 0            # set by `for_tp`; 0 = vocab rounded to vocab_multiple

    def __post_init__(self) -> None:
        object.__setattr__(self, "attention",
                           ATTENTION_ALIASES.get(self.attention, self.attention))
        for key in ("hidden", "layers", "heads", "ffn_hidden", "vocab", "seq_len",
                    "attention_block", "vocab_multiple"):
            if not 1 <= getattr(self, key) <= MAX_SIZE[key]:
                raise FieldError(f"model.{key}", getattr(self, key),
                                       f"must be in 1..{MAX_SIZE[key]}")
        if self.hidden % self.heads:
            raise FieldError("model.heads", self.heads,
                                   f"does not divide model.hidden={self.hidden}; choose heads "
                                   f"in {braces(divisors(self.hidden))}")
        for key, allowed in (("norm", NORMS), ("attention_mask", MASKS),
                             ("attention", ATTENTIONS)):
            if getattr(self, key) not in allowed:
                raise FieldError(f"model.{key}", getattr(self, key),
                                       f"choose one of {braces(allowed)}")
        for key in ("hidden_dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise FieldError(f"model.{key}", getattr(self, key), "must be in [0, 1)")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def causal(self) -> bool:
        return self.attention_mask == "causal"

    @property
    def padded_vocab(self) -> int:
        """Rows of the embedding table (vocab rounded up; padding rows are real parameters)."""
        if self.vocab_padded:
            return self.vocab_padded
        return _round_up(self.vocab, self.vocab_multiple)

    def for_tp(self, tp: int) -> "ModelConfig":
        """The model with its vocabulary padded to a multiple of lcm(vocab_multiple, tp)."""
        return replace(self, vocab_padded=_round_up(self.vocab, math.lcm(self.vocab_multiple,
                                                                          tp)))

    def param_count(self) -> int:
        """Parameters of the unsharded model (embeddings tied with the LM head)."""
        h, f = self.hidden, self.ffn_hidden
        per_layer = 4 * h + 3 * h * h + 3 * h + h * h + h + h * f + f + f * h + h
        return self.layers * per_layer + self.padded_vocab * h + self.seq_len * h + 2 * h


def divisors(n: int) -> list[int]:
    """The divisors of n, ascending (for 'choose tp in ...' messages)."""
    return [d for d in range(1, n + 1) if n % d == 0]


def braces(items: Sequence[object]) -> str:
    """{a, b, c}: the allowed values in a refusal."""
    return "{" + ", ".join(str(i) for i in items) + "}"


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m

"""The transformer being trained, resolved from a preset plus overrides (no MPI, no arrays).

Shapes follow Megatron (thesis 2.3.3, 4.5.1): heads split contiguously over TP ranks,
FC width `ffn_hidden`, a vocabulary padded so that every TP rank holds an equal slice.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

from .moe.config import MoeConfig

class FieldError(ValueError):
    """A setting out of range (model, optimizer): names the field, the value, what is allowed."""

    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field, self.value, self.allowed = field, value, allowed
        super().__init__(f"{field}={value!r}: {allowed}")


NORMS = ("pre", "post")                 # GPT-2/3 pre-LN, BERT post-LN ("Add & Norm")
NORM_KINDS = ("layernorm", "rmsnorm")   # GPT / BERT; Llama (Zhang & Sennrich 2019)
ACTIVATIONS = ("gelu", "swiglu")        # GPT / BERT; Llama (Shazeer 2020): W2(silu(W1 x) W3 x)
POSITIONS = ("learned", "rope")         # GPT / BERT absolute; rotary (Su et al. 2021)
MASKS = ("causal", "bidirectional")     # GPT decoder, BERT encoder
# baseline: materialized S x S scores and a softmax kernel; sd / sdf: that softmax recomposed
# (seed 004), unfused / fused into the GEMMs; flash: FlashAttention-2 (online softmax)
ATTENTIONS = ("baseline", "sd", "sdf", "flash")
ATTENTION_ALIASES = {"dense": "baseline", "blockwise": "flash"}   # the names before issue 10


# Bounds on what a run could ever build or emulate (10x the largest published models:
# PaLM 118 layers, H = 18432, FFN 73728, 256K vocabularies, 1M-token contexts).
MAX_SIZE = {"hidden": 1 << 20, "layers": 10_000, "heads": 1 << 16, "ffn_hidden": 1 << 22,
            "vocab": 1 << 24, "seq_len": 1 << 24, "attention_block": 1 << 24,
            "vocab_multiple": 1 << 16, "kv_heads": 1 << 16, "rope_original_max": 1 << 24,
            "kv_channels": 1 << 16}
MAX_ROPE_SCALING = 1024.0                # Llama 3.1: 8; Llama 3.2 1B/3B: 32


@dataclass(frozen=True)
class ModelConfig:
    """A GPT-, BERT- or Llama-style transformer; every size in elements.

    Llama-family blocks (Touvron et al. 2023; Llama 3, 2407.21783): `norm_kind = "rmsnorm"`,
    `activation = "swiglu"` (`ffn_hidden` is the gate's and the up projection's width),
    `position = "rope"` (theta; Llama 3.1's frequency scaling when `rope_scaling` > 0),
    `kv_heads` < heads (grouped-query attention; 1: multi-query), `bias = false`,
    `tied_embeddings = false` (an output layer of its own).

    Qwen3 attention: `kv_channels` > 0 sets each head's width apart from hidden / heads
    (Megatron-Core TransformerConfig.kv_channels; HF `head_dim`): the query projection is
    then hidden -> heads x kv_channels and the output projection back. `qk_norm` applies an
    RMSNorm over each head's q and k (one gain of kv_channels each, shared by the heads)
    after the QKV GEMM and before RoPE (Megatron-Core `qk_layernorm`; HF Qwen3Attention
    q_norm / k_norm; Qwen3 report, arXiv 2505.09388, 2).

    Multi-head latent attention (DeepSeek-V2 / V3, arXiv 2412.19437 2.1.1; Megatron-Core
    `MLASelfAttention`) when `kv_lora_rank` > 0: the query from a `q_lora_rank` latent (0:
    straight from the hidden state), keys and values from a shared `kv_lora_rank` latent,
    each latent RMSNormed; a query or key head is `head_dim` (kv_channels: qk_head_dim)
    values plus `qk_rope_dim` rotated ones, the key's rotated part one for all heads; a value
    head is `v_head_dim` wide.
    """

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
    norm_kind: str = "layernorm"
    activation: str = "gelu"
    position: str = "learned"
    kv_heads: int = 0                # 0: as many as heads (multi-head attention)
    bias: bool = True                # the linear layers' biases
    tied_embeddings: bool = True     # the LM head is the embedding table
    rope_theta: float = 10000.0
    rope_scaling: float = 0.0        # Llama 3.1's factor (8); 0: no scaling
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max: int = 8192    # the context the scaled frequencies were trained on
    moe: MoeConfig | None = None     # experts in place of the MLP (`model/moe/`)
    kv_channels: int = 0             # a head's width; 0: hidden // heads (Megatron-Core)
    qk_norm: bool = False            # RMSNorm of each head's q and k (Qwen3)
    q_lora_rank: int = 0             # MLA: the query's latent width (0: no query latent)
    kv_lora_rank: int = 0            # MLA: the keys' and values' latent width (0: no MLA)
    qk_rope_dim: int = 0             # MLA: rotated dims per query / key head (decoupled RoPE)
    v_head_dim: int = 0              # MLA: a value head's width (0: head_dim)

    def __post_init__(self) -> None:
        object.__setattr__(self, "attention",
                           ATTENTION_ALIASES.get(self.attention, self.attention))
        for key in ("hidden", "layers", "heads", "ffn_hidden", "vocab", "seq_len",
                    "attention_block", "vocab_multiple"):
            if not 1 <= getattr(self, key) <= MAX_SIZE[key]:
                raise FieldError(f"model.{key}", getattr(self, key),
                                       f"must be in 1..{MAX_SIZE[key]}")
        if not 0 <= self.kv_channels <= MAX_SIZE["kv_channels"]:
            raise FieldError("model.kv_channels", self.kv_channels,
                             f"must be in 1..{MAX_SIZE['kv_channels']} (or 0: hidden // heads)")
        if not self.kv_channels and self.hidden % self.heads:
            raise FieldError("model.heads", self.heads,
                                   f"does not divide model.hidden={self.hidden}; choose heads "
                                   f"in {braces(divisors(self.hidden))} (or set "
                                   "model.kv_channels)")
        for key, allowed in (("norm", NORMS), ("attention_mask", MASKS),
                             ("attention", ATTENTIONS)):
            if getattr(self, key) not in allowed:
                raise FieldError(f"model.{key}", getattr(self, key),
                                       f"choose one of {braces(allowed)}")
        for key in ("hidden_dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise FieldError(f"model.{key}", getattr(self, key), "must be in [0, 1)")
        for key, allowed in (("norm_kind", NORM_KINDS), ("activation", ACTIVATIONS),
                             ("position", POSITIONS)):
            if getattr(self, key) not in allowed:
                raise FieldError(f"model.{key}", getattr(self, key),
                                 f"choose one of {braces(allowed)}")
        self._check_attention_heads()
        self._check_latent()
        self._check_rope()
        if self.qk_norm and self.norm_kind != "rmsnorm":
            raise FieldError("model.qk_norm", True, "needs model.norm_kind='rmsnorm' (Megatron-"
                             "Core's qk_layernorm uses the model's norm; only RMSNorm's is "
                             "modelled)")
        if self.moe is not None and not self.gated:
            raise FieldError("model.activation", self.activation,
                             "must be swiglu with experts (moe): the experts are SwiGLU FFNs")
        if self.moe is not None and self.moe.dense_ffn not in (0, self.ffn_hidden):
            raise FieldError("moe.dense_ffn", self.moe.dense_ffn, "must be 0 or model.ffn_hidden"
                             f"={self.ffn_hidden} (the dense layers' FFN is model.ffn_hidden)")
        if self.moe is not None and self.bias:
            raise FieldError("model.bias", self.bias, "must be false with experts (moe): "
                             "Megatron-Core's MoE layers have no biases")
        if self.moe is not None and self.moe.dense_layers > self.layers:
            raise FieldError("moe.dense_layers", self.moe.dense_layers,
                             f"must be <= model.layers={self.layers}")

    def _check_attention_heads(self) -> None:
        """Grouped-query attention: the KV heads divide the query heads."""
        if not 0 <= self.kv_heads <= min(self.heads, MAX_SIZE["kv_heads"]):
            raise FieldError("model.kv_heads", self.kv_heads,
                             f"must be in 1..model.heads={self.heads} (or 0: as many as heads)")
        if self.kv_heads and self.heads % self.kv_heads:
            raise FieldError("model.kv_heads", self.kv_heads, f"does not divide model.heads="
                             f"{self.heads}; choose kv_heads in {braces(divisors(self.heads))}")

    def _check_latent(self) -> None:
        """MLA's latents and head widths in range; its keys and values are per head."""
        for key in ("q_lora_rank", "kv_lora_rank", "qk_rope_dim", "v_head_dim"):
            if not 0 <= getattr(self, key) <= MAX_SIZE["kv_channels"]:
                raise FieldError(f"model.{key}", getattr(self, key),
                                 f"must be in 0..{MAX_SIZE['kv_channels']}")
        if not self.mla:
            for key in ("q_lora_rank", "qk_rope_dim", "v_head_dim"):
                if getattr(self, key):
                    raise FieldError(f"model.{key}", getattr(self, key), "needs multi-head "
                                     "latent attention: set model.kv_lora_rank > 0 (or 0)")
            return
        why = ("model.position", self.position, "must be 'rope' with model.kv_lora_rank > 0 "
               "(MLA rotates its decoupled qk_rope_dim part)") if self.position != "rope" else \
            ("model.qk_rope_dim", self.qk_rope_dim, "must be even and > 0 with "
             "model.kv_lora_rank > 0") if not self.qk_rope_dim or self.qk_rope_dim % 2 else \
            ("model.kv_heads", self.kv_heads, "must be 0 or model.heads with "
             "model.kv_lora_rank > 0 (MLA's keys and values are per head)") \
            if self.kv_heads not in (0, self.heads) else \
            ("model.qk_norm", True, "must be false with model.kv_lora_rank > 0 (MLA norms its "
             "latents)") if self.qk_norm else \
            ("model.bias", True, "must be false with model.kv_lora_rank > 0") if self.bias \
            else None
        if why is not None:
            raise FieldError(*why)

    @property
    def mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V3)."""
        return self.kv_lora_rank > 0

    @property
    def qk_head_dim(self) -> int:
        """A query or key head's width: head_dim, plus the rotated part under MLA."""
        return self.head_dim + self.qk_rope_dim

    @property
    def v_dim(self) -> int:
        """A value head's width: v_head_dim, or head_dim."""
        return self.v_head_dim or self.head_dim

    def _check_rope(self) -> None:
        """Rotary positions rotate pairs of a head's dimensions; Llama 3.1's scaling needs
        a factor >= 1 and its low-frequency band below its high one."""
        if self.position != "rope":
            return
        if self.head_dim % 2 and not self.mla:
            key = "kv_channels" if self.kv_channels else "heads"
            raise FieldError(f"model.{key}", getattr(self, key), f"gives an odd head size "
                             f"{self.head_dim}; rotary positions need an even one")
        if not 0 < self.rope_theta < math.inf:
            raise FieldError("model.rope_theta", self.rope_theta, "must be > 0")
        if self.rope_scaling and not 1.0 <= self.rope_scaling <= MAX_ROPE_SCALING:
            raise FieldError("model.rope_scaling", self.rope_scaling,
                             f"must be 0 (no scaling) or in [1, {MAX_ROPE_SCALING:g}]")
        if self.rope_scaling and not 0 < self.rope_low_freq_factor < self.rope_high_freq_factor:
            raise FieldError("model.rope_high_freq_factor", self.rope_high_freq_factor,
                             "must exceed model.rope_low_freq_factor="
                             f"{self.rope_low_freq_factor}, both > 0")
        if not 1 <= self.rope_original_max <= MAX_SIZE["rope_original_max"]:
            raise FieldError("model.rope_original_max", self.rope_original_max,
                             f"must be in 1..{MAX_SIZE['rope_original_max']}")

    @property
    def head_dim(self) -> int:
        """A head's width: kv_channels, or hidden // heads when it is 0 (Megatron-Core's
        TransformerConfig: kv_channels defaults to hidden_size // num_attention_heads)."""
        return self.kv_channels or self.hidden // self.heads

    @property
    def attn_width(self) -> int:
        """Rows of the output projection: heads x head_dim (= hidden unless kv_channels says
        otherwise; Megatron-Core `query_projection_size = kv_channels *
        num_attention_heads`), the columns of the query projection too; under MLA heads x
        v_head_dim."""
        return self.heads * self.v_dim

    @property
    def causal(self) -> bool:
        return self.attention_mask == "causal"

    @property
    def groups(self) -> int:
        """KV heads: query heads share them in groups (GQA); as many as heads without."""
        return self.kv_heads or self.heads

    @property
    def gated(self) -> bool:
        """A gated MLP (SwiGLU): FC-1 is two projections, the gate and the up."""
        return self.activation == "swiglu"

    @property
    def padded_vocab(self) -> int:
        """Rows of the embedding table (vocab rounded up; padding rows are real parameters)."""
        if self.vocab_padded:
            return self.vocab_padded
        return _round_up(self.vocab, self.vocab_multiple)

    def for_tp(self, tp: int) -> "ModelConfig":
        """The model with its vocabulary padded to a multiple of vocab_multiple x tp, as
        Megatron pads it (megatron/training/tokenizer/tokenizer.py, `_vocab_size_with_padding`:
        multiple = make_vocab_size_divisible_by * tensor_model_parallel_size)."""
        return replace(self, vocab_padded=_round_up(self.vocab, self.vocab_multiple * tp))

    def param_count(self, active: bool = False) -> int:
        """Parameters of the unsharded model (with its padded vocabulary); `active`: those
        a token passes (an MoE layer's top_k routed experts, not all of them)."""
        h, dh, q = self.hidden, self.head_dim, self.attn_width
        kv = self.groups * dh
        b = 1 if self.bias else 0
        norm = (2 if self.norm_kind == "layernorm" else 1) * h
        qk = 2 * dh if self.qk_norm else 0          # the q and k gains, shared by the heads
        attn = 2 * norm + h * (q + 2 * kv) + b * (q + 2 * kv) + q * h + b * h + qk
        if self.mla:
            attn = 2 * norm + self.latent_attention_params()
        edge = self.padded_vocab * h * (1 if self.tied_embeddings else 2) + norm
        edge += self.seq_len * h if self.position == "learned" else 0
        return self.layers * attn + edge + sum(self.mlp_params(i, active)
                                               for i in range(self.layers))

    def latent_attention_params(self) -> int:
        """MLA's weights and latent norms: q down (or q), its norm, q up; kv down (with the
        shared rotated key), its norm, kv up; the output projection."""
        h, n, ql, kvl = self.hidden, self.heads, self.q_lora_rank, self.kv_lora_rank
        q_out = n * self.qk_head_dim
        q = (h * ql + ql + ql * q_out) if ql else h * q_out
        kv = h * (kvl + self.qk_rope_dim) + kvl + kvl * n * (self.head_dim + self.v_dim)
        return q + kv + n * self.v_dim * h

    def mlp_params(self, layer: int, active: bool = False) -> int:
        """Parameters of a layer's MLP: dense, or its router, experts (the top_k a token
        passes when `active`) and shared experts."""
        h, f, m = self.hidden, self.ffn_hidden, self.moe
        fc1 = (2 if self.gated else 1)
        if m is None or not m.is_moe(layer):
            b = (fc1 * f + h) if self.bias else 0
            return h * fc1 * f + f * h + b
        experts = m.top_k if active else m.experts
        return h * m.experts + experts * 3 * h * m.expert_ffn + 3 * h * m.shared_ffn


def divisors(n: int) -> list[int]:
    """The divisors of n, ascending (for 'choose tp in ...' messages): pairs up to sqrt(n)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def braces(items: Sequence[object]) -> str:
    """{a, b, c}: the allowed values in a refusal."""
    return "{" + ", ".join(str(i) for i in items) + "}"


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m

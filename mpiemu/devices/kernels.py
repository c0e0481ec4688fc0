"""Memory-bound GPU kernels of a transformer layer, as real stacks launch them.

`unfused`: one kernel per op, as plain PyTorch runs a layer (bias add, GeLU, dropout,
residual add, scale, mask, softmax each their own kernel over DRAM). `fused`: Megatron-LM's
fused kernels (megatron/model/fused_bias_gelu.py `bias_gelu_impl`,
megatron/model/transformer.py `bias_dropout_add_fused_train`, megatron/model/fused_softmax.py
`FusedScaleMaskSoftmax` over the scaled_(upper_triang_)masked_softmax CUDA kernels, apex
`FusedLayerNorm`; for Llama-family blocks Megatron-Core's and Transformer Engine's fused
RMSNorm, SwiGLU and RoPE): one kernel where PyTorch runs several, the intermediate never
written.

A kernel costs its launch plus max(DRAM bytes / achievable streaming bandwidth, vector flops
/ vector peak, special-function ops / SFU rate). The achievable bandwidth is the preset's
`memory.dram_efficiency` (a measured copy rate over the peak, sourced per device).
Element-wise flop counts per element are ASSUMPTIONs (instruction counts); these kernels are
memory bound, so their bytes decide their time (thesis 4.2.3).
"""
from __future__ import annotations

from dataclasses import dataclass

MODES = ("unfused", "fused")
STAT_BYTES = 4          # LayerNorm mean / rstd and softmax statistics are kept in fp32
MASK_BYTES = 1          # a dropout keep-mask element
GELU_FLOPS = 20         # ASSUMPTION: erf GeLU (thesis Eq. 4.1) as ~20 vector instructions
LN_FLOPS_FWD, LN_FLOPS_BWD, LN_FLOPS_GB = 8, 12, 4   # ASSUMPTION: instruction counts
SOFTMAX_FLOPS = 5       # seed 004 2.2: max, subtract, exp, sum, normalize per element
RMS_FLOPS_FWD, RMS_FLOPS_BWD = 4, 8   # ASSUMPTION: instruction counts (LayerNorm's, less the mean)
SILU_FLOPS = 4          # ASSUMPTION: z / (1 + exp(-z)): negate, add, divide around one exp
ROPE_FLOPS = 3          # x cos + rotate_half(x) sin: two multiplies and an add per element


@dataclass(frozen=True)
class Kernel:
    """One GPU kernel's work: vector flops, special-function ops, DRAM bytes.

    `tag` names it inside its op (the trace event is `<op>.<tag>`, or `<op>` when empty).
    """

    flops: float
    read_bytes: float
    write_bytes: float
    tag: str = ""
    sfu_ops: float = 0.0
    bw_util: float = 1.0     # share of the achievable streaming bandwidth it reaches

    def __post_init__(self) -> None:
        if not 0 < self.bw_util <= 1:
            raise ValueError(f"kernel {self.tag!r}: bw_util={self.bw_util} must be in (0, 1]")

    @property
    def dram_bytes(self) -> float:
        return self.read_bytes + self.write_bytes


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"train.kernels={mode!r}; choose one of {list(MODES)}")
    return mode


def layernorm(rows: int, width: int, e: int, backward: bool = False) -> list[Kernel]:
    """LayerNorm: one kernel forward in both modes (PyTorch's native LN and apex's fused LN
    alike); backward, two passes over dy and x in both.

    backward: the parameter gradients in their own kernel (read dy, x, statistics; write the
    gamma and beta gradients: Megatron-LM megatron/fused_kernels/layer_norm_cuda_kernel.cu
    at c685fb5e, cuComputePartGradGammaBeta + cuComputeGradGammaBeta, lines 782-801;
    PyTorch's GammaBetaBackwardCUDAKernel), then the input gradient (read dy, x,
    statistics, gamma; write dx: cuComputeGradInput, line 816).
    """
    act, stats, gamma = rows * width * e, 2 * rows * STAT_BYTES, width * e
    params = 2 * gamma                                       # gamma and beta
    if backward:
        return [Kernel(LN_FLOPS_GB * rows * width, 2 * act + stats, params, "gamma_beta"),
                Kernel(LN_FLOPS_BWD * rows * width, 2 * act + stats + gamma, act)]
    return [Kernel(LN_FLOPS_FWD * rows * width, act + params, act + stats)]


def rmsnorm(rows: int, width: int, e: int, backward: bool = False) -> list[Kernel]:
    """RMSNorm (Llama): Transformer Engine's kernels, fp32 math over half-precision rows
    (transformer_engine/common/normalization/rmsnorm, as Megatron-Core's
    `TENorm(normalization="RMSNorm")` runs it): forward reads x and gamma, writes y and one
    fp32 rstd per row; backward one kernel reads dy, x, rstd and gamma, writes dx and the
    gamma gradient (its per-block partial sums, a width each, are ASSUMPTION: folded into
    the one write of gamma).
    """
    act, stats, gamma = rows * width * e, rows * STAT_BYTES, width * e
    if backward:
        return [Kernel(RMS_FLOPS_BWD * rows * width, 2 * act + stats + gamma, act + gamma)]
    return [Kernel(RMS_FLOPS_FWD * rows * width, act + gamma, act + stats)]


def swiglu(rows: int, width: int, e: int, mode: str, bias: bool, backward: bool = False
           ) -> list[Kernel]:
    """SwiGLU over FC-1's [rows, 2 width] output, the gate and the up halves: silu(gate) x up.

    fused (Megatron-Core megatron/core/fusions/fused_bias_swiglu.py, `bias_swiglu_impl`):
    read both halves (and the bias), write the product; backward reads the output gradient
    and both halves, writes both halves' gradients. unfused (plain PyTorch): `silu` and the
    product each a kernel; backward the product's two gradients, then `silu_backward`.
    With a bias its gradient is a column sum of the halves' gradient.
    """
    n, act, b = rows * width, rows * width * e, 2 * width * e if bias else 0
    grad_bias = [Kernel(2 * n, 2 * act, b, "bias_grad")] if bias else []
    if backward and check_mode(mode) == "fused":
        return [Kernel((SILU_FLOPS + 4) * n, 3 * act + b, 2 * act, "", n)] + grad_bias
    if backward:
        return [Kernel(2 * n, 3 * act, 2 * act, "mul.bwd"),
                Kernel((SILU_FLOPS + 2) * n, 2 * act, act, "silu.bwd", n)] + grad_bias
    if check_mode(mode) == "fused":
        return [Kernel((SILU_FLOPS + 1) * n + (2 * n if bias else 0), 2 * act + b, act, "", n)]
    pre = [Kernel(2 * n, 2 * act + b, 2 * act, "bias")] if bias else []
    return pre + [Kernel(SILU_FLOPS * n, act, act, "silu", n),
                  Kernel(n, 2 * act, act, "mul")]


def rope(rows: int, width: int, seq: int, head_dim: int, e: int, mode: str
         ) -> list[Kernel]:
    """Rotary positions applied to one of q or k ([rows, width], heads side by side), its
    backward alike. fused (Transformer Engine's `fused_apply_rotary_pos_emb`, Megatron-Core's
    `apply_rope_fusion`): read x and the fp32 angles of the rows' positions ([seq,
    head_dim]), write the rotated x. unfused (the reference PyTorch of Megatron-Core's
    `_apply_rotary_pos_emb_bshd`): x cos, rotate_half(x) (a `cat` of the negated halves),
    its product with sin, and the sum, each through DRAM.
    """
    n, act, angles = rows * width, rows * width * e, seq * head_dim * STAT_BYTES
    if check_mode(mode) == "fused":
        return [Kernel(ROPE_FLOPS * n, act + 2 * angles, act)]
    return [Kernel(n, act + angles, act, "cos"), Kernel(n, act, act, "rotate_half"),
            Kernel(n, act + angles, act, "sin"), Kernel(n, 2 * act, act, "add")]


def bias_gelu(rows: int, width: int, e: int, mode: str, backward: bool = False,
              bias: bool = True) -> list[Kernel]:
    """FC-1's bias + GeLU (the GEMM wrote f = x W without bias).

    fused (Megatron bias_gelu_impl): read f and b, write gelu(f + b); backward recomputes
    f + b: read dy, f, b, write dx. unfused: `f + b` then `gelu`, each through DRAM (forward
    keeps the sum for backward); backward is `gelu_backward`. Both modes then reduce dx over
    rows for the bias gradient. Without a bias: GeLU alone, no bias gradient.
    """
    n, act, b = rows * width, rows * width * e, width * e if bias else 0
    grad_bias = [Kernel(n, act, b, "bias_grad")] if bias else []
    if backward:
        return [Kernel(2 * GELU_FLOPS * n, 2 * act + b, act, "", n)] + grad_bias
    if check_mode(mode) == "fused" or not bias:
        return [Kernel(GELU_FLOPS * n + (n if bias else 0), act + b, act, "", n)]
    return [Kernel(n, act + b, act, "bias"), Kernel(GELU_FLOPS * n, act, act, "gelu", n)]


def bias_dropout_add(rows: int, width: int, e: int, dropout: bool, mode: str,
                     backward: bool = False, bias: bool = True) -> list[Kernel]:
    """x + dropout(a + b) after the row-parallel GEMM (thesis 2.2.2 Add & Norm).

    fused (Megatron bias_dropout_add_fused_train): one kernel reads a, b, x and writes the sum
    and the keep-mask. unfused: `a + b`, `dropout`, `+ x` as three kernels. backward (both):
    the residual passes dy through; dropout's backward multiplies by the mask and the bias
    gradient reduces it over rows, fused into one kernel in both stacks' autograd graphs.
    Without a bias (Llama) forward adds the residual (dropped out if dropout is on);
    backward has nothing to compute unless dropout is on.
    """
    n, act, b = rows * width, rows * width * e, width * e if bias else 0
    mask = n * MASK_BYTES if dropout else 0
    if backward:
        return [Kernel(2 * n, act + mask, act + b)] if bias or dropout else []
    if check_mode(mode) == "fused":
        return [Kernel((3 if bias else 2) * n, 2 * act + b, act + mask)]
    out = [Kernel(n, act + b, act, "bias")] if bias else []
    if dropout:
        out.append(Kernel(n, act, act + mask, "dropout"))
    return out + [Kernel(n, 2 * act, act, "add")]


def softmax(scores: int, e: int, mode: str, dropout: bool, masked: bool,
            backward: bool = False, row_fill: float = 1.0, loaded: float = 1.0
            ) -> list[Kernel]:
    """Attention softmax over the materialized scores (seed 004 baseline; thesis 2.2.2).

    fused (Megatron FusedScaleMaskSoftmax): scale, mask and softmax in one kernel, then
    dropout. unfused (plain PyTorch): scale, `masked_fill`, softmax, dropout, each a kernel.
    backward: dropout's mask multiply, then the softmax gradient from the output alone
    (seed 004 Eq. 3), with scale (and mask) folded in when fused.
    `row_fill` < 1: a block-sparse layout where a row holds that share of nonzeros. The
    softmax kernel still gives each thread block a full row's threads, and only the share
    on nonzero blocks issues loads (seed 004 2.4), so it reaches that share of the
    bandwidth: its time is a dense row's, its traffic the nonzeros'.
    `loaded` < 1 (fused only): the share of the scores the fused kernels load, forward and
    backward; they still store every element (Megatron-LM's causal kernel loads a row's
    unmasked lower triangle and writes zeros above it: megatron/fused_kernels/
    scaled_upper_triang_masked_softmax.h at de593298, `element_index < local_seq`). As
    for `row_fill`, a warp still walks the whole row, so the kernel takes a dense row's
    time and moves the triangle's bytes. Megatron's kernel, built and timed on an H100,
    bears this out (results/kernels/README.md, "Measured here": its time beside both
    readings).
    """
    s, m = scores * e, scores * MASK_BYTES
    part = s * (loaded if check_mode(mode) == "fused" else 1.0)     # what softmax loads
    out: list[Kernel]
    if backward:
        out = [Kernel(scores, s + m, s, "dropout.bwd")] if dropout else []
        out.append(Kernel(3 * scores, 2 * part, s, "softmax.bwd",
                          bw_util=(2 * part + s) / (3 * s)))
        if check_mode(mode) == "unfused":
            out += [Kernel(scores, s, s, "mask.bwd")] if masked else []
            out.append(Kernel(scores, s, s, "scale.bwd"))
        return out
    sm = Kernel(SOFTMAX_FLOPS * scores, part, s, "softmax", scores,
                min(1.0, row_fill) * (part + s) / (2 * s))
    if check_mode(mode) == "fused":
        out = [sm]
    else:
        out = [Kernel(scores, s, s, "scale")]
        out += [Kernel(scores, s + m, s, "mask")] if masked else []
        out.append(sm)
    if dropout:
        out.append(Kernel(scores, s, s + m, "dropout"))
    return out


def bias_grad(rows: int, width: int, e: int) -> list[Kernel]:
    """Column sums of a gradient (a bias gradient not fused into another kernel)."""
    return [Kernel(rows * width, rows * width * e, width * e)]


def cross_entropy(rows: int, vocab: int, e: int, mode: str, backward: bool = False
                  ) -> list[Kernel]:
    """The cross-entropy over a rank's [rows, vocab] logits, in fp32: half-precision logits
    are cast first and their gradient cast back.

    fused (Megatron-LM's vocab-parallel cross-entropy, written as PyTorch ops: Megatron has
    no fused kernel for it; megatron/model/gpt_model.py at de593298,
    `vocab_parallel_cross_entropy(output.float(), labels)`, `--fp16-lm-cross-entropy` off by
    default; megatron/mpu/cross_entropy.py): the row max, its in-place subtraction, the
    in-place exp, the row sum and the in-place division that leaves the softmax for
    backward, each a pass over the logits; backward the target's one subtracted and the
    in-place product with the loss gradient. unfused (plain PyTorch `F.cross_entropy`, run
    in fp32 under autocast): `log_softmax` (one pass) and `nll_loss`; backward
    `nll_loss_backward` (a zero-filled gradient, then the targets' entries) and
    `log_softmax_backward` (reads the gradient and the output). ASSUMPTION: the target
    masking, gather and loss (a few values per row, a dozen small kernels in Megatron) are
    charged as one kernel, `target`.
    """
    n, f, r = rows * vocab, STAT_BYTES, rows * STAT_BYTES
    up = [Kernel(0, n * e, n * f, "cast")] if e < f else []        # logits to fp32
    down = [Kernel(0, n * f, n * e, "cast")] if e < f else []      # their gradient back
    target = Kernel(rows, 3 * r + rows * 8, r, "target")
    fused = check_mode(mode) == "fused"
    if backward and fused:
        return [target, Kernel(n, n * f + r, n * f, "scale")] + down
    if backward:
        return [Kernel(0, 0, n * f, "zero"), target,
                Kernel(2 * n, 2 * n * f, n * f, "log_softmax.bwd", n)] + down
    if not fused:
        return up + [Kernel(SOFTMAX_FLOPS * n, n * f, n * f, "log_softmax", n), target]
    return up + [Kernel(n, n * f, r, "max"), Kernel(n, n * f + r, n * f, "sub"), target,
                 Kernel(0, n * f, n * f, "exp", n), Kernel(n, n * f, r, "sum"),
                 Kernel(n, n * f + r, n * f, "div")]

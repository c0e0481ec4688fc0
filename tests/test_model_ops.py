"""Primitive ops of the sharded transformer: values, gradients (finite differences), costs."""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import pytest

from mpiemu.model import attention as attn
from mpiemu.model import ops
from mpiemu.model.special import norm_cdf

RNG = np.random.default_rng(7)


def numeric_grad(f: Callable[[], float], x: np.ndarray, h: float = 1e-6) -> np.ndarray:
    """Central differences of a scalar function of x (x perturbed in place)."""
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + h
        fp = f()
        x[i] = old - h
        fm = f()
        x[i] = old
        g[i] = (fp - fm) / (2 * h)
    return g


def test_norm_cdf_matches_libm_erf_to_double_precision() -> None:
    x = np.linspace(-38.0, 38.0, 20001)
    ref = np.array([0.5 * math.erfc(-v / math.sqrt(2.0)) for v in x])
    ours = norm_cdf(x)
    assert np.max(np.abs(ours - ref)) < 2e-15
    tail = ref > 1e-280                  # below that exp() goes subnormal
    assert np.max(np.abs(ours - ref)[tail] / ref[tail]) < 1e-12


def test_layernorm_backward_equals_finite_differences() -> None:
    x, g, b = RNG.standard_normal((5, 6)), RNG.standard_normal(6), RNG.standard_normal(6)
    w = RNG.standard_normal((5, 6))
    y, c = ops.layernorm(x, g, b, 1e-5)
    dx, dg, db = ops.layernorm_back(w, c, g)
    loss = lambda: float((ops.layernorm(x, g, b, 1e-5)[0] * w).sum())  # noqa: E731
    np.testing.assert_allclose(dx, numeric_grad(loss, x), atol=1e-8)
    np.testing.assert_allclose(dg, numeric_grad(loss, g), atol=1e-8)
    np.testing.assert_allclose(db, numeric_grad(loss, b), atol=1e-8)


def test_bias_gelu_is_the_erf_gelu_and_its_backward_is_exact() -> None:
    f, b, w = RNG.standard_normal((4, 7)), RNG.standard_normal(7), RNG.standard_normal((4, 7))
    x, y = ops.bias_gelu(f, b)
    ref = np.vectorize(lambda v: v * 0.5 * (1 + math.erf(v / math.sqrt(2))))(f + b)
    np.testing.assert_allclose(y, ref, rtol=1e-14, atol=1e-15)
    dx, db = ops.bias_gelu_back(w, x)
    loss = lambda: float((ops.bias_gelu(f, b)[1] * w).sum())  # noqa: E731
    np.testing.assert_allclose(dx, numeric_grad(loss, f), atol=1e-8)
    np.testing.assert_allclose(db, numeric_grad(loss, b), atol=1e-8)


def test_bias_dropout_add_scales_kept_elements_and_adds_the_residual() -> None:
    x, a, b = RNG.standard_normal((3, 4)), RNG.standard_normal((3, 4)), RNG.standard_normal(4)
    keep = RNG.random((3, 4)) > 0.5
    out = ops.bias_dropout_add(x, a, b, keep, 0.5)
    np.testing.assert_allclose(out, x + np.where(keep, 2.0 * (a + b), 0.0))
    np.testing.assert_allclose(ops.bias_dropout_add(x, a, b, None, 0.0), x + a + b)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("p", [0.0, 0.3])
@pytest.mark.parametrize("block", [3, 4, 16])
def test_flash_attention_equals_dense_forward_and_backward(causal: bool, p: float,
                                                               block: int) -> None:
    q, k, v, do = (RNG.standard_normal((2, 3, 11, 4)) for _ in range(4))
    keep = RNG.random((2, 3, 11, 11)) >= p if p else None
    o1, c1 = attn.dense(q, k, v, causal, keep, p)
    o2, c2 = attn.flash_forward(q, k, v, causal, lambda: keep, p, block)
    np.testing.assert_allclose(o2, o1, atol=1e-14)
    for g1, g2 in zip(attn.dense_back(do, c1, p),
                      attn.flash_backward(do, o2, c2, causal, lambda: keep, p, block)):
        np.testing.assert_allclose(g2, g1, atol=1e-13)


@pytest.mark.parametrize("causal", [True, False])
def test_dense_attention_backward_equals_finite_differences(causal: bool) -> None:
    q, k, v, w = (RNG.standard_normal((1, 2, 5, 3)) for _ in range(4))
    keep = RNG.random((1, 2, 5, 5)) >= 0.2
    _, c = attn.dense(q, k, v, causal, keep, 0.2)
    dq, dk, dv = attn.dense_back(w, c, 0.2)
    loss = lambda: float((attn.dense(q, k, v, causal, keep, 0.2)[0] * w).sum())  # noqa: E731
    for ours, x in ((dq, q), (dk, k), (dv, v)):
        np.testing.assert_allclose(ours, numeric_grad(loss, x), atol=1e-8)


def test_causal_attention_ignores_later_positions() -> None:
    q, k, v = (RNG.standard_normal((1, 1, 6, 2)) for _ in range(3))
    o, _ = attn.dense(q, k, v, True, None, 0.0)
    k2, v2 = k.copy(), v.copy()
    k2[..., 4:, :] += 5.0
    v2[..., 4:, :] -= 3.0
    o2, _ = attn.dense(q, k2, v2, True, None, 0.0)
    np.testing.assert_allclose(o2[..., :4, :], o[..., :4, :])


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_vocab_parallel_cross_entropy_equals_the_full_softmax(tp: int) -> None:
    rows, vocab = 6, 12
    logits = RNG.standard_normal((rows, vocab))
    targets = RNG.integers(0, vocab, rows)
    vl = vocab // tp
    stats = np.stack([ops.ce_local_stats(logits[:, r * vl:(r + 1) * vl], targets, r * vl)
                      for r in range(tp)])
    lse, picked = ops.ce_combine(stats)
    full_lse = np.log(np.exp(logits).sum(1))
    np.testing.assert_allclose(lse, full_lse, rtol=1e-14)
    np.testing.assert_allclose(picked, logits[np.arange(rows), targets])
    soft = np.exp(logits - full_lse[:, None])
    soft[np.arange(rows), targets] -= 1.0
    grads = [ops.ce_back(logits[:, r * vl:(r + 1) * vl], lse, targets, r * vl, 0.5)
             for r in range(tp)]
    np.testing.assert_allclose(np.concatenate(grads, axis=1), 0.5 * soft, atol=1e-15)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_vocab_parallel_embedding_sums_to_the_full_lookup_and_scatter(tp: int) -> None:
    vocab, h = 8, 3
    table = RNG.standard_normal((vocab, h))
    ids = RNG.integers(0, vocab, 10)
    vl = vocab // tp
    parts = [ops.embed_lookup(table[r * vl:(r + 1) * vl], ids, r * vl) for r in range(tp)]
    np.testing.assert_array_equal(sum(parts), table[ids])
    dy = RNG.standard_normal((10, h))
    full = np.zeros_like(table)
    np.add.at(full, ids, dy)
    for r in range(tp):
        local = np.zeros((vl, h))
        ops.embed_scatter(local, ids, r * vl, dy)
        np.testing.assert_allclose(local, full[r * vl:(r + 1) * vl])


def test_costs_state_flops_and_bytes_in_the_emulated_dtype() -> None:
    [fwd] = ops.layernorm_cost(rows=10, width=4, e=2)
    assert fwd.read_bytes == 10 * 4 * 2 + 2 * 4 * 2
    assert fwd.write_bytes == 10 * 4 * 2 + 2 * 10 * ops.STAT_BYTES
    [drop] = ops.dropout_add_cost(10, 4, 2, dropout=True)
    assert drop.write_bytes == 10 * 4 * (2 + ops.MASK_BYTES)
    assert ops.dropout_add_cost(10, 4, 4, dropout=False)[0].write_bytes == 10 * 4 * 4
    assert ops.bias_gelu_cost(10, 4, 2)[0].flops == ops.GELU_FLOPS * 40 + 40


def test_unfused_kernels_launch_one_kernel_per_op_and_move_more_bytes() -> None:
    """Plain PyTorch (unfused) runs bias, GeLU, dropout, add, scale, mask, softmax as their
    own kernels through DRAM; Megatron's fused kernels do each group in one pass."""
    for fused, unfused in ((ops.bias_gelu_cost(64, 32, 2), ops.bias_gelu_cost(64, 32, 2,
                                                                               mode="unfused")),
                           (ops.dropout_add_cost(64, 32, 2, True),
                            ops.dropout_add_cost(64, 32, 2, True, mode="unfused"))):
        assert len(unfused) > len(fused) == 1
        assert sum(k.dram_bytes for k in unfused) > sum(k.dram_bytes for k in fused)

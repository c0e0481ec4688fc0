"""SWattention numerics: the blockwise CG/CPE algorithm equals dense attention in float64."""
from __future__ import annotations

import numpy as np
import pytest

from mpiemu.model.swattention import (Layout, cg_heads, dense_attention, dense_attention_grads,
                                   rma_tree_sum, swattention_bwd, swattention_fwd)

TOL = 1e-10
# (B, N, S, H, layout): S not a multiple of Br or Bc, several inner iterations with a partial
# last one, the paper's 64 CPEs with a partial single iteration, and blocks larger than S.
CASES = [
    (1, 3, 100, 8, Layout(br=4, bc=16, cgs=6, cpes=8)),
    (2, 4, 77, 16, Layout(br=2, bc=8, cgs=6, cpes=16)),
    (1, 7, 130, 8, Layout(br=1, bc=32, cgs=6, cpes=64)),
    (1, 2, 50, 4, Layout(br=16, bc=64, cgs=6, cpes=64)),
]


def _qkv(b: int, n: int, s: int, h: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((b, n, s, h)) for _ in range(4)]


@pytest.mark.parametrize("b,n,s,h,lay", CASES)
@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_blockwise_forward_equals_dense_attention(b: int, n: int, s: int, h: int, lay: Layout,
                                                  dropout: float) -> None:
    q, k, v, _ = _qkv(b, n, s, h)
    o, _, _ = swattention_fwd(q, k, v, lay, dropout_p=dropout, seed=5)
    ref = dense_attention(q, k, v, dropout_p=dropout, seed=5)
    assert np.abs(o - ref).max() <= TOL


@pytest.mark.parametrize("b,n,s,h,lay", CASES)
@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_blockwise_gradients_equal_dense_gradients(b: int, n: int, s: int, h: int, lay: Layout,
                                                   dropout: float) -> None:
    q, k, v, do = _qkv(b, n, s, h, seed=1)
    o, l, m = swattention_fwd(q, k, v, lay, dropout_p=dropout, seed=2)
    grads = swattention_bwd(q, k, v, o, do, l, m, lay, dropout_p=dropout, seed=2)
    refs = dense_attention_grads(q, k, v, do, dropout_p=dropout, seed=2)
    for g, r in zip(grads, refs):
        assert np.abs(g - r).max() <= TOL


def test_non_causal_attention_also_matches() -> None:
    q, k, v, do = _qkv(1, 2, 45, 8, seed=3)
    lay = Layout(br=4, bc=16, cpes=4)
    o, l, m = swattention_fwd(q, k, v, lay, causal=False)
    assert np.abs(o - dense_attention(q, k, v, causal=False)).max() <= TOL
    grads = swattention_bwd(q, k, v, o, do, l, m, lay, causal=False)
    for g, r in zip(grads, dense_attention_grads(q, k, v, do, causal=False)):
        assert np.abs(g - r).max() <= TOL


def test_dense_reference_gradients_match_finite_differences() -> None:
    q, k, v, do = _qkv(1, 1, 6, 3, seed=4)
    grads = dense_attention_grads(q, k, v, do, dropout_p=0.3, seed=1)
    eps = 1e-6
    for i, x in enumerate((q, k, v)):
        for idx in [(0, 0, 0, 0), (0, 0, 3, 1), (0, 0, 5, 2)]:
            args = [q, k, v]
            hi, lo = x.copy(), x.copy()
            hi[idx] += eps
            lo[idx] -= eps
            args[i] = hi
            f_hi = (dense_attention(*args, dropout_p=0.3, seed=1) * do).sum()
            args[i] = lo
            f_lo = (dense_attention(*args, dropout_p=0.3, seed=1) * do).sum()
            assert (f_hi - f_lo) / (2 * eps) == pytest.approx(grads[i][idx], abs=1e-7)


def test_rma_tree_sums_all_cpe_partials() -> None:
    parts = np.random.default_rng(0).standard_normal((64, 5, 3))
    assert np.allclose(rma_tree_sum(parts), parts.sum(0), rtol=0, atol=1e-12)


def test_heads_are_split_over_the_cgs_without_gaps() -> None:
    groups = cg_heads(24, 6)
    assert [len(g) for g in groups] == [4] * 6
    assert sorted(h for g in groups for h in g) == list(range(24))
    assert sorted(h for g in cg_heads(7, 6) for h in g) == list(range(7))


def test_mismatched_shapes_and_bad_dropout_are_refused() -> None:
    q, k, v, _ = _qkv(1, 2, 8, 4)
    with pytest.raises(ValueError, match="share one"):
        swattention_fwd(q, k[:, :1], v)
    with pytest.raises(ValueError, match="dropout_p"):
        swattention_fwd(q, k, v, dropout_p=1.0)
    with pytest.raises(ValueError, match="power of two"):
        Layout(cpes=48)

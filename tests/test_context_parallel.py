"""Context parallelism's pieces without MPI: the causal-balanced chunk layout, the ring's
step order and sections, and that the ring's blockwise attention, merged by log-sum-exp,
equals dense attention over the gathered sequence, forward and backward (the MPI ring itself
is checked against the one-process reference in tests/test_llama_parity.py)."""
from __future__ import annotations

import numpy as np
import pytest

from mpiemu.model import context_parallel as cpm


@pytest.mark.parametrize("cp", [1, 2, 3, 4, 8])
def test_chunks_are_balanced_and_cover_the_sequence(cp: int) -> None:
    seq = 2 * cp * 5
    every = [cpm.positions(seq, cp, r) for r in range(cp)]
    assert sorted(np.concatenate(every).tolist()) == list(range(seq))
    # the causal work of a rank (keys each query sees) is the same on every rank
    work = {int((p + 1).sum()) for p in every}
    assert len(work) == 1


def test_chunk_layout_of_megatron_core() -> None:
    assert [cpm.chunks(2, r) for r in range(2)] == [(0, 3), (1, 2)]
    assert [cpm.chunks(4, r) for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    assert cpm.positions(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert cpm.positions(8, 2, 1).tolist() == [2, 3, 4, 5]


def test_ring_step_order() -> None:
    # forward: the diagonal first, then the KV that started on r - 1, r - 2, ...
    assert cpm.sources(4, 1) == [1, 0, 3, 2]
    # backward: the KV of r + 1 first, the diagonal last
    assert cpm.sources(4, 1, backward=True) == [2, 3, 0, 1]
    for cp in (2, 3, 4):
        for r in range(cp):
            for bwd in (False, True):
                assert sorted(cpm.sources(cp, r, bwd)) == list(range(cp))


def test_every_step_but_the_diagonal_costs_the_same() -> None:
    cp, rows = 4, 64
    for r in range(cp):
        secs = [cpm.section(r, s) for s in cpm.sources(cp, r)]
        assert secs[0] == "diagonal" and "diagonal" not in secs[1:]
        flops = {cpm.section_shape(s, 8, rows, 16, 2, False).scores for s in secs[1:]}
        assert len(flops) == 1


def dense(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool) -> np.ndarray:
    s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    if causal:
        n = s.shape[-1]
        s = np.where(np.tril(np.ones((n, n), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


@pytest.mark.parametrize("cp", [1, 2, 4])
@pytest.mark.parametrize("causal", [True, False])
def test_ring_attention_equals_dense(cp: int, causal: bool) -> None:
    rng = np.random.default_rng(cp)
    seq, heads, d = 2 * cp * 3, 2, 4
    q, k, v, do = (rng.standard_normal((1, heads, seq, d)) for _ in range(4))
    o_ref = dense(q, k, v, causal)
    # the dense gradients by finite differences would be slow; use the analytic softmax VJP
    dq_ref, dk_ref, dv_ref = dense_grads(q, k, v, do, causal)
    dk_sum, dv_sum = np.zeros_like(k), np.zeros_like(v)
    for r in range(cp):
        pq = cpm.positions(seq, cp, r)
        o = lse = None
        for src in cpm.sources(cp, r):
            pk = cpm.positions(seq, cp, src)
            o, lse = cpm.merge(o, lse, *cpm.block_forward(q[..., pq, :], k[..., pk, :],
                                                           v[..., pk, :], pq, pk, causal,
                                                           None, 0.0))
        assert o is not None and lse is not None
        np.testing.assert_allclose(o, o_ref[..., pq, :], rtol=1e-12, atol=1e-12)
        delta = (do[..., pq, :] * o).sum(-1)
        dq = np.zeros_like(o)
        for src in cpm.sources(cp, r, backward=True):
            pk = cpm.positions(seq, cp, src)
            gq, gk, gv = cpm.block_backward(do[..., pq, :], delta, q[..., pq, :],
                                            k[..., pk, :], v[..., pk, :], lse, pq, pk,
                                            causal, None, 0.0)
            dq += gq
            dk_sum[..., pk, :] += gk
            dv_sum[..., pk, :] += gv
        np.testing.assert_allclose(dq, dq_ref[..., pq, :], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dk_sum, dk_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dv_sum, dv_ref, rtol=1e-10, atol=1e-12)


def dense_grads(q: np.ndarray, k: np.ndarray, v: np.ndarray, do: np.ndarray, causal: bool
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of sum(do * dense(q, k, v)) by the softmax VJP, written out in full."""
    scale = 1.0 / np.sqrt(q.shape[-1])
    s = q @ k.swapaxes(-1, -2) * scale
    if causal:
        n = s.shape[-1]
        s = np.where(np.tril(np.ones((n, n), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dv = p.swapaxes(-1, -2) @ do
    dp = do @ v.swapaxes(-1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True)) * scale
    return ds @ k, ds.swapaxes(-1, -2) @ q, dv

"""SWattention numerics in numpy: the two-level blockwise algorithm of SWA 3.1-3.2, and a dense
reference.

Level 1: the B x N heads are split over the CGs, each CG looping over its heads. Level 2: in a
CG, the outer loop walks K/V blocks of Bc rows that every CPE holds; the inner loop gives CPE k
the Q block i = it * 64 + k of Br rows (the 64 CPEs' blocks are computed as one batch here).
The forward keeps O, l, m in "DRAM" and updates them with FlashAttention-1's online softmax; the
backward accumulates dK~, dV~ per CPE and sums them with the RMA tree of SWA Fig. 4. Dropout
masks come from a counter-based hash of (seed, head, row, column), so blockwise and dense runs
draw the same mask (SWA derives each CPE's stream from R, the CG and the CPE index instead).
Arrays are [B, N, S, H] (SWA 2.1).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


CPES = 64
CGS = 6
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


@dataclass(frozen=True)
class Layout:
    """Block sizes and the machine the blocks are spread over."""

    br: int = 16
    bc: int = 64
    cgs: int = CGS
    cpes: int = CPES

    def __post_init__(self) -> None:
        if min(self.br, self.bc, self.cgs, self.cpes) < 1:
            raise ValueError(f"layout values must be >= 1, got {self}")
        if self.cpes & (self.cpes - 1):
            raise ValueError(f"cpes={self.cpes} must be a power of two (RMA tree, SWA Fig. 4)")


def keep_mask(seed: int, head: int, rows: np.ndarray, cols: np.ndarray, s: int,
              keep: float) -> np.ndarray:
    """Dropout keep mask Z[rows, cols] of one head: splitmix64 of the element's global index."""
    idx = (np.uint64(head) * np.uint64(s) + rows.astype(np.uint64)) * np.uint64(s) \
        + cols.astype(np.uint64)
    x = idx + np.uint64((seed * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
        x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(11)).astype(np.float64) * 2.0 ** -53 < keep


def _dropout_p_ok(p: float) -> float:
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout_p={p} must be in [0, 1)")
    return 1.0 - p


def _z(seed: int, head: int, r: np.ndarray, c: np.ndarray, s: int, keep: float
       ) -> np.ndarray | None:
    """Z / keep for a block (None when there is no dropout)."""
    if keep == 1.0:
        return None
    return keep_mask(seed, head, r, c, s, keep) / keep


# --- dense reference ------------------------------------------------------------------------
def _dense_p(q: np.ndarray, k: np.ndarray, causal: bool) -> np.ndarray:
    s = q.shape[-2]
    scores = (q @ np.swapaxes(k, -1, -2)) / math.sqrt(q.shape[-1])   # (B, N, S, S)
    if causal:
        scores = np.where(np.triu(np.ones((s, s), bool), 1), -np.inf, scores)
    scores = scores - scores.max(-1, keepdims=True)
    p = np.exp(scores)
    return p / p.sum(-1, keepdims=True)


def _dense_z(shape: tuple[int, ...], keep: float, seed: int) -> np.ndarray | None:
    b, n, s, _ = shape
    if keep == 1.0:
        return None
    r, c = np.meshgrid(np.arange(s), np.arange(s), indexing="ij")
    z = np.stack([keep_mask(seed, h, r, c, s, keep) for h in range(b * n)])
    return z.reshape(b, n, s, s) / keep                              # (B, N, S, S)


def dense_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, causal: bool = True,
                    dropout_p: float = 0.0, seed: int = 0) -> np.ndarray:
    """O = dropout(softmax(Q K^T / sqrt(H) + mask)) V, with the [S, S] matrix in memory."""
    keep = _dropout_p_ok(dropout_p)
    p = _dense_p(q, k, causal)
    z = _dense_z(q.shape, keep, seed)
    return (p if z is None else p * z) @ v


def dense_attention_grads(q: np.ndarray, k: np.ndarray, v: np.ndarray, do: np.ndarray, *,
                          causal: bool = True, dropout_p: float = 0.0, seed: int = 0
                          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """dQ, dK, dV of `dense_attention` by the chain rule through softmax."""
    keep = _dropout_p_ok(dropout_p)
    tau = 1.0 / math.sqrt(q.shape[-1])
    p = _dense_p(q, k, causal)
    z = _dense_z(q.shape, keep, seed)
    pd = p if z is None else p * z
    dv = np.swapaxes(pd, -1, -2) @ do
    dpd = do @ np.swapaxes(v, -1, -2)
    dp = dpd if z is None else dpd * z
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    return tau * ds @ k, tau * np.swapaxes(ds, -1, -2) @ q, dv


# --- SWattention --------------------------------------------------------------------------------
def cg_heads(n_heads: int, cgs: int) -> list[range]:
    """Level 1: contiguous groups of heads, one group per CG (SWA 3.1)."""
    per = math.ceil(n_heads / cgs)
    return [range(c * per, min(n_heads, (c + 1) * per)) for c in range(cgs)]


def _pad(x: np.ndarray, rows: int) -> np.ndarray:
    return np.concatenate([x, np.zeros((rows - x.shape[0], x.shape[1]), x.dtype)])


def _block_scores(qb: np.ndarray, kj: np.ndarray, rows: np.ndarray, cols: np.ndarray,
                  s: int, causal: bool) -> np.ndarray:
    """tau Q_i K_j^T for every CPE's block, with the causal and padding mask (SWA 3.2)."""
    sij = (qb @ kj.T) / math.sqrt(qb.shape[-1])                       # (A, Br, Bc)
    dead = cols[None, None, :] >= s
    if causal:
        dead = dead | (cols[None, None, :] > rows[:, :, None])
    return np.where(dead, -np.inf, sij)


def _rows(it: int, a: int, lay: Layout) -> np.ndarray:
    """Global row indices of the Q blocks of CPEs 0..a-1 in inner iteration `it`."""
    first = (it * lay.cpes + np.arange(a)) * lay.br
    return first[:, None] + np.arange(lay.br)[None, :]               # (A, Br)


def _head_fwd(q: np.ndarray, k: np.ndarray, v: np.ndarray, lay: Layout, causal: bool,
              keep: float, seed: int, head: int) -> tuple[np.ndarray, ...]:
    """One [S, H] head on one CG (SWA Algorithm 2); returns O, l, m."""
    s, h = q.shape
    tr, tc = math.ceil(s / lay.br), math.ceil(s / lay.bc)
    qp = _pad(q, tr * lay.br).reshape(tr, lay.br, h)                  # (Tr, Br, H)
    kp, vp = _pad(k, tc * lay.bc), _pad(v, tc * lay.bc)
    o = np.zeros((tr, lay.br, h))                                     # in DRAM
    l = np.zeros((tr, lay.br))
    m = np.full((tr, lay.br), -np.inf)
    for j in range(tc):                                               # outer: K_j, V_j to all
        cols = j * lay.bc + np.arange(lay.bc)
        kj, vj = kp[cols], vp[cols]
        for it in range(math.ceil(tr / lay.cpes)):                    # inner: CPE k, block i
            blk = slice(it * lay.cpes, min(tr, (it + 1) * lay.cpes))
            rows = _rows(it, blk.stop - blk.start, lay)
            sij = _block_scores(qp[blk], kj, rows, cols, s, causal)   # line 11
            m_t = sij.max(-1)
            m_new = np.maximum(m[blk], m_t)
            safe = np.where(np.isfinite(m_new), m_new, 0.0)
            p_t = np.exp(sij - safe[..., None])                       # masked -> 0
            a_old = np.exp(m[blk] - safe)
            l_new = a_old * l[blk] + p_t.sum(-1)
            z = _z(seed, head, rows[..., None], cols[None, None, :], s, keep)
            pv = (p_t if z is None else p_t * z) @ vj                 # (A, Br, H)
            inv = np.where(l_new > 0, 1.0 / np.where(l_new > 0, l_new, 1.0), 0.0)
            o[blk] = ((a_old * l[blk])[..., None] * o[blk] + pv) * inv[..., None]
            l[blk], m[blk] = l_new, m_new                             # store O_i, l_i, m_i
    return o.reshape(-1, h)[:s], l.reshape(-1)[:s], m.reshape(-1)[:s]


def rma_tree_sum(parts: np.ndarray) -> np.ndarray:
    """SWA Fig. 4: in round i, CPE k < 2^(R-1-i) adds CPE k + 2^(R-1-i)'s array; CPE 0 ends
    with the sum after R = log2(#CPEs) rounds."""
    parts = parts.copy()
    loop = parts.shape[0] // 2
    while loop >= 1:
        parts[:loop] += parts[loop:2 * loop]                          # RMA get + SIMD add
        loop //= 2
    return parts[0]


def _head_bwd(q: np.ndarray, k: np.ndarray, v: np.ndarray, o: np.ndarray, do: np.ndarray,
              l: np.ndarray, m: np.ndarray, lay: Layout, causal: bool, keep: float, seed: int,
              head: int) -> tuple[np.ndarray, ...]:
    """One head's dQ, dK, dV on one CG (SWA Algorithm 3 with the RMA tree of dK, dV)."""
    s, h = q.shape
    tau = 1.0 / math.sqrt(h)
    tr, tc = math.ceil(s / lay.br), math.ceil(s / lay.bc)
    qp, op_, dop = (_pad(x, tr * lay.br).reshape(tr, lay.br, h) for x in (q, o, do))
    lp = np.concatenate([l, np.ones(tr * lay.br - s)]).reshape(tr, lay.br)
    mp = np.concatenate([m, np.zeros(tr * lay.br - s)]).reshape(tr, lay.br)
    kp, vp = _pad(k, tc * lay.bc), _pad(v, tc * lay.bc)
    dq = np.zeros((tr, lay.br, h))
    dk, dv = np.zeros((tc * lay.bc, h)), np.zeros((tc * lay.bc, h))
    for j in range(tc):
        cols = j * lay.bc + np.arange(lay.bc)
        kj, vj = kp[cols], vp[cols]
        dk_t = np.zeros((lay.cpes, lay.bc, h))                        # per-CPE LDM partials
        dv_t = np.zeros((lay.cpes, lay.bc, h))
        for it in range(math.ceil(tr / lay.cpes)):
            blk = slice(it * lay.cpes, min(tr, (it + 1) * lay.cpes))
            a = blk.stop - blk.start
            rows = _rows(it, a, lay)
            sij = _block_scores(qp[blk], kj, rows, cols, s, causal)   # line 12 (recompute)
            p = np.exp(sij - mp[blk][..., None]) / lp[blk][..., None]
            z = _z(seed, head, rows[..., None], cols[None, None, :], s, keep)
            pd = p if z is None else p * z
            dv_t[:a] += np.swapaxes(pd, -1, -2) @ dop[blk]            # line 17
            dpd = dop[blk] @ vj.T                                     # line 18
            dp = dpd if z is None else dpd * z
            d_i = (dop[blk] * op_[blk]).sum(-1)                       # line 20
            ds = p * (dp - d_i[..., None])                            # line 21
            dq[blk] += tau * ds @ kj                                  # line 22 (DRAM)
            dk_t[:a] += tau * np.swapaxes(ds, -1, -2) @ qp[blk]       # line 23
        dk[cols], dv[cols] = rma_tree_sum(dk_t), rma_tree_sum(dv_t)   # CPE 0 stores
    return dq.reshape(-1, h)[:s], dk[:s], dv[:s]


def _check(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
    if q.ndim != 4 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(f"Q, K, V must share one [B, N, S, H] shape, got {q.shape}, "
                         f"{k.shape}, {v.shape}")


def swattention_fwd(q: np.ndarray, k: np.ndarray, v: np.ndarray, layout: Layout = Layout(), *,
                    causal: bool = True, dropout_p: float = 0.0, seed: int = 0
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """O [B, N, S, H] and the softmax statistics l, m [B, N, S] saved for the backward."""
    _check(q, k, v)
    keep = _dropout_p_ok(dropout_p)
    b, n, s, h = q.shape
    flat = [x.reshape(b * n, s, h) for x in (q, k, v)]                # (B*N, S, H)
    o = np.zeros((b * n, s, h))
    l, m = np.zeros((b * n, s)), np.zeros((b * n, s))
    for heads in cg_heads(b * n, layout.cgs):                         # level 1: CGs
        for hd in heads:                                              # a CG's outermost loop
            qh, kh, vh = (x[hd] for x in flat)
            o[hd], l[hd], m[hd] = _head_fwd(qh, kh, vh, layout, causal, keep, seed, hd)
    return o.reshape(b, n, s, h), l.reshape(b, n, s), m.reshape(b, n, s)


def swattention_bwd(q: np.ndarray, k: np.ndarray, v: np.ndarray, o: np.ndarray,
                    do: np.ndarray, l: np.ndarray, m: np.ndarray, layout: Layout = Layout(),
                    *, causal: bool = True, dropout_p: float = 0.0, seed: int = 0
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """dQ, dK, dV [B, N, S, H] from the forward's O, l, m (recomputing P blockwise)."""
    _check(q, k, v)
    keep = _dropout_p_ok(dropout_p)
    b, n, s, h = q.shape
    flat = [x.reshape(b * n, s, h) for x in (q, k, v, o, do)]         # (B*N, S, H)
    lf, mf = l.reshape(b * n, s), m.reshape(b * n, s)
    grads = [np.zeros((b * n, s, h)) for _ in range(3)]
    for heads in cg_heads(b * n, layout.cgs):
        for hd in heads:
            qh, kh, vh, oh, doh = (x[hd] for x in flat)
            out = _head_bwd(qh, kh, vh, oh, doh, lf[hd], mf[hd], layout, causal, keep, seed, hd)
            for g, x in zip(grads, out):
                g[hd] = x
    return tuple(g.reshape(b, n, s, h) for g in grads)  # type: ignore[return-value]

"""Context parallelism: each of `cp` ranks holds two chunks of the sequence and attends to all
of it (Megatron-Core with Transformer Engine's `context_parallel.py`).

Layout: the sequence is cut into 2 cp chunks; rank r holds chunks r and 2cp - 1 - r, so
every rank has as much of the causal triangle (Megatron-Core
`_get_batch_on_this_cp_rank_per_sequence_balancing`; cp = 2: rank 0 holds 0 and 3, rank 1
holds 1 and 2). Everything but attention runs on the rank's rows as without CP.

Attention, `parallel.cp_comm`:
* "p2p" (`AttnFuncWithCPAndKVP2P`): the KV of the rank's chunks travels around the CP ring
  as real messages. Forward step i (0 .. cp-1) attends the local queries to the KV that
  started on rank (r - i) mod cp, sent on to r + 1 while it is used (the send and the next
  receive are posted first, the block's attention runs meanwhile, then the receive is
  waited for); the partial outputs merge by their log-sum-exp. Step 0 is the diagonal
  (causal); steps with a source rank below r see only its first chunk ("lower", both query
  chunks x half the KV), above r only the second query chunk sees it ("upper"): every step
  but the diagonal costs the same. Backward runs the ring the other way: step i's KV came
  from rank (r + i + 1) mod cp, so the diagonal is last; each rank adds its share to the
  block's dK, dV, which travel with the KV, and ends with its own chunks' whole gradient
  (messages: its KV, then KV and dKV, the last dKV alone: 2 (cp - 1) KV blocks in all).
* "all_gather" (`AttnFuncWithCPAndKVAllGather`, Llama 3 3.3.2): K and V are all-gathered
  over CP, the local queries attend to the whole sequence; backward gathers them again,
  and reduce-scatters dK, dV to the ranks that hold their chunks. Not overlapped.
KV blocks carry the rank's KV heads once (grouped-query attention repeats them only for the
math). Scores are masked by the rows' true positions, so the result equals dense
attention over the gathered sequence.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..devices.attention_gpu import AttnShape
from .executor import Executor

TAG_FWD, TAG_BWD = 700, 701         # CP ring messages (header and payload share a tag)
SECTIONS = ("diagonal", "lower", "upper")
MaskFn = Callable[[np.ndarray, np.ndarray], np.ndarray | None]   # (pq, pk) -> keep-mask


def chunks(cp: int, rank: int) -> tuple[int, int]:
    """The sequence chunks rank `rank` holds, of 2 cp: (r, 2 cp - 1 - r)."""
    return rank, 2 * cp - 1 - rank


def positions(seq: int, cp: int, rank: int) -> np.ndarray:
    """The sequence positions of the rank's rows, its two chunks in order."""
    size = seq // (2 * cp)
    return np.concatenate([np.arange(c * size, (c + 1) * size) for c in chunks(cp, rank)])


def sources(cp: int, rank: int, backward: bool = False) -> list[int]:
    """The rank whose KV each ring step attends to: forward (r - i) mod cp (the diagonal
    first), backward (r + i + 1) mod cp (the diagonal last)."""
    return [(rank + i + 1) % cp if backward else (rank - i) % cp for i in range(cp)]


def section(rank: int, src: int) -> str:
    """Which part of a KV block the rank's queries see (causal): all of its own, the first
    chunk of a lower rank's, a higher rank's with the second query chunk only."""
    return "diagonal" if src == rank else ("lower" if src < rank else "upper")


def section_shape(sec: str, heads: int, rows: int, head_dim: int, e: int, dropout: bool
                  ) -> AttnShape:
    """The attention one ring step computes (`rows`: the rank's positions per sequence)."""
    if sec == "diagonal":
        return AttnShape(heads, rows, rows, head_dim, e, dropout, causal=True, training=True)
    if sec == "lower":
        return AttnShape(heads, rows, rows // 2, head_dim, e, dropout, training=True)
    return AttnShape(heads, rows // 2, rows, head_dim, e, dropout, training=True)


# -- the math of one (queries, KV block) pair --------------------------------------------------
def block_forward(q: np.ndarray, k: np.ndarray, v: np.ndarray, pq: np.ndarray,
                  pk: np.ndarray, causal: bool, keep: np.ndarray | None, p: float
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(o, lse) of queries at positions pq over keys at pk; o normalized within the block,
    rows that see no key give o = 0, lse = -inf. q (B, h, Sq, d), k and v (B, h, Sk, d)."""
    s = (q @ k.swapaxes(-1, -2)) * (1.0 / float(np.sqrt(q.shape[-1])))
    if causal:
        s = np.where(pk[None, :] <= pq[:, None], s, -np.inf)
    mx = s.max(-1, keepdims=True)
    seen = np.isfinite(mx)
    e = np.exp(s - np.where(seen, mx, 0.0))
    denom = e.sum(-1, keepdims=True)
    if keep is not None:
        e *= keep.astype(e.dtype) * (1.0 / (1.0 - p))
    o = np.where(seen, (e @ v) / np.where(seen, denom, 1.0), 0.0)
    lse = np.where(seen, mx + np.log(np.where(seen, denom, 1.0)), -np.inf)[..., 0]
    return o, lse


def merge(o: np.ndarray | None, lse: np.ndarray | None, o2: np.ndarray, lse2: np.ndarray
          ) -> tuple[np.ndarray, np.ndarray]:
    """Two partial attentions of the same queries as one (TE's lse correction)."""
    if o is None or lse is None:
        return o2, lse2
    total = np.logaddexp(lse, lse2)
    return (np.exp(lse - total)[..., None] * o + np.exp(lse2 - total)[..., None] * o2,
            total)


def block_backward(do: np.ndarray, delta: np.ndarray, q: np.ndarray, k: np.ndarray,
                   v: np.ndarray, lse: np.ndarray, pq: np.ndarray, pk: np.ndarray,
                   causal: bool, keep: np.ndarray | None, p: float
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dq, dk, dv) of the queries over one KV block, from the whole attention's lse and
    delta = rowsum(dO * O) (FlashAttention-2's backward, Dao 2023 Alg. 2)."""
    scale = 1.0 / float(np.sqrt(q.shape[-1]))
    s = (q @ k.swapaxes(-1, -2)) * scale
    if causal:
        s = np.where(pk[None, :] <= pq[:, None], s, -np.inf)
    probs = np.exp(s - lse[..., None])
    dprobs = do @ v.swapaxes(-1, -2)
    dropped = probs
    if keep is not None:
        kp = keep.astype(probs.dtype) * (1.0 / (1.0 - p))
        dropped = probs * kp
        dprobs *= kp
    ds = probs * (dprobs - delta[..., None]) * scale
    return ds @ k, ds.swapaxes(-1, -2) @ q, dropped.swapaxes(-1, -2) @ do


class CpAttention:
    """The attention core of one layer's heads on one CP rank, by the ring or after an
    all-gather of the KV (`comm`); `repeat` / `fold` expand the KV heads for the math and
    sum their gradients back (GQA). `shape`: the rank's attention (its rows per sequence
    as queries); `kv_bytes`: one KV block on the wire (the rank's K and V)."""

    def __init__(self, ex: Executor, name: str, seq: int, causal: bool, p: float,
                 comm: str, shape: AttnShape, kv_bytes: float,
                 repeat: Callable[[np.ndarray], np.ndarray],
                 fold: Callable[[np.ndarray], np.ndarray]) -> None:
        assert ex.cp is not None, "context parallelism needs its group"
        self.E, self.group, self.name, self.seq = ex, ex.cp, name, seq
        self.causal, self.p, self.comm, self.shape = causal, p, comm, shape
        self.kv_bytes, self.repeat, self.fold = kv_bytes, repeat, fold
        self.cp, self.rank = self.group.size, self.group.rank
        self.pq = positions(seq, self.cp, self.rank)
        self.next, self.prev = (self.rank + 1) % self.cp, (self.rank - 1) % self.cp

    # -- forward ------------------------------------------------------------------------------
    def forward(self, q: np.ndarray | None, k: np.ndarray | None, v: np.ndarray | None,
                keep: MaskFn) -> tuple[np.ndarray | None, dict[str, np.ndarray]]:
        """o (B, h, S_loc, d) and what backward needs (q, k, v, o, lse)."""
        kv = None if k is None or v is None else np.stack([k, v])    # (2, B, hk, S_loc, d)
        if self.comm == "all_gather":
            o, lse = self._gathered_forward(q, kv, keep)
        else:
            o, lse = self._ring_forward(q, kv, keep)
        if q is None or o is None or lse is None:
            return None, {}
        return o, {"q": q, "k": k, "v": v, "lse": lse}                # type: ignore[dict-item]

    def _ring_forward(self, q: np.ndarray | None, kv: np.ndarray | None, keep: MaskFn
                      ) -> tuple[np.ndarray | None, np.ndarray | None]:
        E = self.E
        o = lse = None
        sends = []
        for i, src in enumerate(sources(self.cp, self.rank)):
            rh, nxt = None, None
            if i < self.cp - 1:       # start: the next block from r - 1, this one to r + 1
                nxt = None if kv is None else np.empty_like(kv)
                rh = E.recv(self.group, nxt, self.prev, TAG_FWD)
                sends.append(E.send(self.group, f"{self.name}.kv", kv, self.next, TAG_FWD,
                                    self.kv_bytes))
            if q is not None and kv is not None:     # meanwhile: this block's attention
                o, lse = merge(o, lse, *self._attend(q, kv, src, keep))
            self._charge(src, i, backward=False)
            if rh is not None:        # wait: the next step needs its block
                E.wait_recv(rh)
                kv = nxt
        for h in sends:               # every payload out before its buffer goes
            h.wait()
        return o, lse

    def _gathered_forward(self, q: np.ndarray | None, kv: np.ndarray | None, keep: MaskFn
                          ) -> tuple[np.ndarray | None, np.ndarray | None]:
        every = self._gather(kv, "kv.ag")
        self._charge(self.rank, 0, backward=False)
        if q is None or every is None:
            return None, None
        k, v, pk = self._whole(every)
        return block_forward(q, self.repeat(k), self.repeat(v), self.pq, pk, self.causal,
                             self._keep(keep, pk), self.p)

    # -- backward -----------------------------------------------------------------------------
    def backward(self, do: np.ndarray | None, o: np.ndarray | None, c: dict[str, np.ndarray],
                 keep: MaskFn) -> tuple[np.ndarray | None, np.ndarray | None,
                                        np.ndarray | None]:
        """(dq, dk, dv) of the rank's queries and of its own chunks' KV."""
        if self.comm == "all_gather":
            return self._gathered_backward(do, o, c, keep)
        return self._ring_backward(do, o, c, keep)

    def _ring_backward(self, do: np.ndarray | None, o: np.ndarray | None,
                       c: dict[str, np.ndarray], keep: MaskFn
                       ) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
        E, cp, on = self.E, self.cp, do is not None
        own = np.stack([c["k"], c["v"]]) if on else None
        delta = (do * o).sum(-1) if on and o is not None else None
        dq = np.zeros_like(c["q"]) if on else None
        # step 0's block is r + 1's own KV; ours goes to r - 1
        buf = None if own is None else np.empty_like(own)
        rh = E.recv(self.group, buf, self.next, TAG_BWD)
        sends = [E.send(self.group, f"{self.name}.kv.bwd", own, self.prev, TAG_BWD,
                        self.kv_bytes)]
        kv = dkv = None
        for i, src in enumerate(sources(cp, self.rank, backward=True)):
            last = i == cp - 1
            E.wait_recv(rh)
            if on and own is not None and buf is not None:
                kv = buf if i == 0 else (own if last else buf[:2])
                dkv = np.zeros_like(own) if i == 0 else (buf if last else buf[2:])
            if not last:              # the next message: KV and dKV, or dKV alone (own)
                blocks = 2 if i + 1 == cp - 1 else 4
                buf = None if own is None else np.empty((blocks, *own.shape[1:]), own.dtype)
                rh = E.recv(self.group, buf, self.next, TAG_BWD)
            if on:
                assert do is not None and kv is not None and dkv is not None and dq is not None
                gq, gk, gv = self._attend_back(do, delta, c, kv, src, keep)
                dq += gq
                dkv += np.stack([self.fold(gk), self.fold(gv)])
            self._charge(src, i, backward=True)
            if not last:              # on to r - 1: its owner takes the gradient alone
                alone = i == cp - 2
                payload = None if not on else (dkv if alone else np.concatenate([kv, dkv]))
                sends.append(E.send(self.group, f"{self.name}.dkv", payload, self.prev,
                                    TAG_BWD, self.kv_bytes * (1 if alone else 2)))
        for h in sends:
            h.wait()
        if not on or dkv is None:
            return None, None, None
        return dq, dkv[0], dkv[1]

    def _gathered_backward(self, do: np.ndarray | None, o: np.ndarray | None,
                           c: dict[str, np.ndarray], keep: MaskFn
                           ) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
        on = do is not None
        every = self._gather(np.stack([c["k"], c["v"]]) if on else None, "kv.bwd.ag")
        self._charge(self.rank, 0, backward=True)
        grads = None
        if do is not None and every is not None and o is not None:
            k, v, pk = self._whole(every)
            delta = (do * o).sum(-1)
            dq, dk, dv = block_backward(do, delta, c["q"], self.repeat(k), self.repeat(v),
                                        c["lse"], self.pq, pk, self.causal,
                                        self._keep(keep, pk), self.p)
            dkv = np.stack([self.fold(dk), self.fold(dv)])          # (2, B, hk, S, d)
            s_loc = dkv.shape[-2] // self.cp
            grads = (dq, np.stack(np.split(dkv, self.cp, axis=-2)))   # (cp, 2, B, hk, s, d)
            assert grads[1].shape[-2] == s_loc
        mine = self.E.reduce_scatter(self.group, f"{self.name}.dkv.rs",
                                     None if grads is None else grads[1].reshape(-1),
                                     self.cp * self.kv_elems, self.kv_itemsize)
        if grads is None or mine is None:
            return None, None, None
        dkv = mine.reshape(2, *c["k"].shape)
        return grads[0], dkv[0], dkv[1]

    # -- helpers ------------------------------------------------------------------------------
    @property
    def kv_elems(self) -> int:
        """Elements of one rank's KV block (K and V)."""
        return int(self.kv_bytes // self.kv_itemsize)

    @property
    def kv_itemsize(self) -> int:
        return self.shape.e

    def _gather(self, kv: np.ndarray | None, tag: str) -> np.ndarray | None:
        """Every rank's KV block, in rank order: (cp, 2, B, hk, S_loc, d)."""
        flat = None if kv is None else kv.reshape(-1)
        every = self.E.all_gather(self.group, f"{self.name}.{tag}", flat, self.kv_elems,
                                  self.kv_itemsize)
        return None if every is None or kv is None else every.reshape(self.cp, *kv.shape)

    def _whole(self, every: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """K and V of the whole sequence (chunks in rank order) and their positions."""
        pk = np.concatenate([positions(self.seq, self.cp, r) for r in range(self.cp)])
        return (np.concatenate(list(every[:, 0]), axis=-2),
                np.concatenate(list(every[:, 1]), axis=-2), pk)

    def _keep(self, keep: MaskFn, pk: np.ndarray) -> np.ndarray | None:
        return keep(self.pq, pk) if self.p > 0 else None

    def _attend(self, q: np.ndarray, kv: np.ndarray, src: int, keep: MaskFn
                ) -> tuple[np.ndarray, np.ndarray]:
        pk = positions(self.seq, self.cp, src)
        return block_forward(q, self.repeat(kv[0]), self.repeat(kv[1]), self.pq, pk,
                             self.causal, self._keep(keep, pk), self.p)

    def _attend_back(self, do: np.ndarray, delta: np.ndarray | None, c: dict[str, np.ndarray],
                     kv: np.ndarray, src: int, keep: MaskFn
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        assert delta is not None
        pk = positions(self.seq, self.cp, src)
        return block_backward(do, delta, c["q"], self.repeat(kv[0]), self.repeat(kv[1]),
                              c["lse"], self.pq, pk, self.causal, self._keep(keep, pk), self.p)

    def _charge(self, src: int, step: int, backward: bool) -> None:
        """The attention of one ring step (its section's shape), or over the gathered KV."""
        a, what = self.shape, "bwd" if backward else "fwd"
        if self.comm == "all_gather":
            a = a._replace(keys=a.seq * self.cp)
            self.E.attention(f"{self.name}.{what}", a, "flash", backward)
            return
        if self.causal:
            a = section_shape(section(self.rank, src), a.heads, a.seq, a.head_dim, a.e,
                              a.dropout)
        self.E.attention(f"{self.name}.cp{step}.{what}", a, "flash", backward)

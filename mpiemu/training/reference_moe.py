"""The one-process reference's Mixture-of-Experts MLP, written apart from the sharded layer
(`model/moe/`): dense masks per expert instead of permutations and all-to-alls.

What it must share with the sharded run to compare at all is where routing is defined per
group of tokens: capacity is applied over the tokens one rank holds (its CP chunks, its SP
shard of a micro-batch: `TokenLayout`), the auxiliary and z losses over one micro-batch (the
tensor-and-context-parallel group's tokens), each micro-batch's losses weighted by its
share of the step (micro_batch / global_batch), the expert bias updated after each step from
the step's kept tokens per expert (DeepSeek-V3 2.1.2).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..model.config import ModelConfig
from .reference_blocks import Cache, silu, silu_grad


class TokenLayout(NamedTuple):
    """How a micro-batch's tokens are split among the ranks that route them."""

    micro_batch: int
    tp: int                     # TP ranks splitting the rows (sequence parallelism), else 1
    cp: int


def rank_sets(lay: TokenLayout, batch: int, seq: int) -> list[np.ndarray]:
    """Token indices (b * seq + s) of each rank's rows, in its row order: position-major
    over the micro-batch's samples, CP rank c holding chunks c and 2 cp - 1 - c, SP rank r
    the r-th contiguous slice of those rows."""
    out = []
    w = seq // (2 * lay.cp)
    for b0 in range(0, batch, lay.micro_batch):
        samples = np.arange(b0, b0 + lay.micro_batch)
        for c in range(lay.cp):
            pos = np.r_[c * w:(c + 1) * w, (2 * lay.cp - 1 - c) * w:(2 * lay.cp - c) * w]
            rows = (samples[None, :] * seq + pos[:, None]).reshape(-1)   # (pos, sample)
            out += np.split(rows, lay.tp)
    return out


def micro_sets(lay: TokenLayout, batch: int, seq: int) -> list[np.ndarray]:
    """Token indices of each micro-batch."""
    return [np.arange(b0 * seq, (b0 + lay.micro_batch) * seq)
            for b0 in range(0, batch, lay.micro_batch)]


class ReferenceMoe:
    """The experts of every MoE layer of the reference model (parameters `layers.i.moe.*`,
    `layers.i.shared.*`)."""

    def __init__(self, cfg: ModelConfig, lay: TokenLayout, global_batch: int) -> None:
        assert cfg.moe is not None
        self.cfg, self.m, self.lay, self.gb = cfg, cfg.moe, lay, global_batch
        self.bias = {i: np.zeros(self.m.experts) for i in range(cfg.layers)}
        self.step_counts: dict[int, np.ndarray] = {}

    # -- routing ----------------------------------------------------------------------------
    def _scores(self, logits: np.ndarray) -> np.ndarray:
        if self.m.score == "sigmoid":
            return 1.0 / (1.0 + np.exp(-logits))
        z = np.exp(logits - logits.max(1, keepdims=True))
        return z / z.sum(1, keepdims=True)

    def _choose(self, key: np.ndarray) -> np.ndarray:
        """Each row's top-k columns, largest first, ties to the lower column."""
        m, (n, E) = self.m, key.shape
        if m.groups > 1:
            size, take = E // m.groups, max(m.top_k // m.group_top_k, 1)
            for t in range(n):
                g = [sorted(key[t, j * size:(j + 1) * size])[::-1][:take] for j in range(m.groups)]
                best = sorted(range(m.groups), key=lambda j: (-sum(g[j]), j))[:m.group_top_k]
                for j in set(range(m.groups)) - set(best):
                    key[t, j * size:(j + 1) * size] = -np.inf
        return np.lexsort((np.broadcast_to(np.arange(E), key.shape), -key))[:, :m.top_k]

    def _route(self, logits: np.ndarray, layer: int) -> dict[str, np.ndarray]:
        """One rank's tokens: scores, choices, weights, capacity."""
        m = self.m
        s = self._scores(logits)
        chosen = self._choose(s + self.bias[layer] if m.expert_bias else s.copy())
        raw = np.take_along_axis(s, chosen, 1)
        norm = m.normalize or (m.score == "softmax" and not m.pre_softmax)
        total = raw.sum(1, keepdims=True) if norm else np.ones((len(raw), 1))
        w = raw / total * m.topk_scale
        kept = np.ones(chosen.shape, bool)
        if m.capacity_factor:
            cap = math.ceil(len(logits) * m.top_k / m.experts * m.capacity_factor)
            for e in range(m.experts):
                slots = sorted(zip(*np.nonzero(chosen == e)), key=lambda ts: (-w[ts], ts))
                for ts in slots[cap:]:
                    kept[ts] = False
        return {"s": s, "chosen": chosen, "raw": raw, "total": total, "w": w * kept,
                "kept": kept}

    # -- forward / backward -----------------------------------------------------------------
    def forward(self, p: dict[str, np.ndarray], x: np.ndarray, i: int
                ) -> tuple[np.ndarray, Cache]:
        bsz, s, h = x.shape
        flat = x.reshape(-1, h)
        pre = f"layers.{i}."
        logits = flat @ p[pre + "moe.router"]
        n, k = len(flat), self.m.top_k
        r = {"s": np.zeros_like(logits), "chosen": np.zeros((n, k), np.int64),
             "raw": np.zeros((n, k)), "total": np.zeros((n, 1)), "w": np.zeros((n, k)),
             "kept": np.zeros((n, k), bool)}
        for rows in rank_sets(self.lay, bsz, s):
            for key, val in self._route(logits[rows], i).items():
                r[key][rows] = val
        kept_counts = np.array([(r["chosen"][r["kept"]] == e).sum()
                                for e in range(self.m.experts)])
        self.step_counts[i] = self.step_counts.get(i, 0) + kept_counts
        out = np.zeros_like(flat)
        experts = []
        for e in range(self.m.experts):
            t, j = np.nonzero((r["chosen"] == e) & r["kept"])
            xe, q = flat[t], f"{pre}moe.{e}."
            g, u = xe @ p[q + "w1"], xe @ p[q + "w3"]
            a = silu(g) * u
            y = a @ p[q + "w2"]
            np.add.at(out, t, r["w"][t, j][:, None] * y)
            experts.append((t, j, xe, g, u, a, y))
        c: Cache = {"flat": flat, "logits": logits, "r": r, "experts": experts}
        if self.m.shared_ffn:
            q = pre + "shared."
            g, u = flat @ p[q + "w1"], flat @ p[q + "w3"]
            c["shared"] = (g, u, silu(g) * u)
            out = out + c["shared"][2] @ p[q + "w2"]
        return out.reshape(x.shape), c

    def backward(self, p: dict[str, np.ndarray], dout: np.ndarray, c: Cache, i: int,
                 g: dict[str, np.ndarray]) -> np.ndarray:
        pre, flat, r = f"layers.{i}.", c["flat"], c["r"]
        d = dout.reshape(flat.shape)
        dx = np.zeros_like(flat)
        dw = np.zeros(r["w"].shape)
        for e, (t, j, xe, ge, ue, ae, ye) in enumerate(c["experts"]):
            q = f"{pre}moe.{e}."
            dw[t, j] = (d[t] * ye).sum(1)
            dy = d[t] * r["w"][t, j][:, None]
            g[q + "w2"] = ae.T @ dy
            da = dy @ p[q + "w2"].T
            dg, du = da * ue * silu_grad(ge), da * silu(ge)
            g[q + "w1"], g[q + "w3"] = xe.T @ dg, xe.T @ du
            np.add.at(dx, t, dg @ p[q + "w1"].T + du @ p[q + "w3"].T)
        if self.m.shared_ffn:
            q, (gs, us, a) = pre + "shared.", c["shared"]
            g[q + "w2"] = a.T @ d
            da = d @ p[q + "w2"].T
            dg, du = da * us * silu_grad(gs), da * silu(gs)
            g[q + "w1"], g[q + "w3"] = flat.T @ dg, flat.T @ du
            dx += dg @ p[q + "w1"].T + du @ p[q + "w3"].T
        dlogits = self._logits_grad(r, dw, c["logits"], len(dout))
        g[pre + "moe.router"] = flat.T @ dlogits
        return (dx + dlogits @ p[pre + "moe.router"].T).reshape(dout.shape)

    def _logits_grad(self, r: dict[str, np.ndarray], dw: np.ndarray, logits: np.ndarray,
                     batch: int) -> np.ndarray:
        """Through the weights, the auxiliary loss and the scores; plus the z-loss."""
        m, s = self.m, r["s"]
        share = self.lay.micro_batch / self.gb
        dwk = dw * r["kept"] * m.topk_scale
        draw = dwk / r["total"] - (dwk * r["raw"]).sum(1, keepdims=True) / r["total"] ** 2 \
            if (m.normalize or (m.score == "softmax" and not m.pre_softmax)) else dwk
        ds = np.zeros_like(s)
        for t in range(len(s)):
            ds[t, r["chosen"][t]] += draw[t]
        dz = np.zeros_like(s)
        for toks in micro_sets(self.lay, batch, self.cfg.seq_len):
            T = len(toks)
            if m.aux_loss != "none" and m.aux_loss_coeff:
                seqs = [toks] if m.aux_loss == "global" else \
                    np.split(toks, len(toks) // self.cfg.seq_len)
                for q in seqs:                  # per sequence (seq): averaged over them
                    f = np.bincount(r["chosen"][q].reshape(-1), minlength=m.experts)
                    ds[q] += self._aux_grad(s[q], f * (m.aux_loss_coeff * m.experts / (
                        m.top_k * len(q) ** 2 * len(seqs)) * share))
            if m.z_loss_coeff:
                lg = logits[toks]
                mx = lg.max(1, keepdims=True)
                z = np.exp(lg - mx)
                lse = mx + np.log(z.sum(1, keepdims=True))
                dz[toks] = m.z_loss_coeff / T * share * 2 * lse * z / z.sum(1, keepdims=True)
        if m.score == "softmax":
            return s * (ds - (ds * s).sum(1, keepdims=True)) + dz
        return ds * s * (1 - s) + dz

    def _aux_grad(self, s: np.ndarray, coeff: np.ndarray) -> np.ndarray:
        """d(sum_t sum_e coeff_e p_te)/ds with p the softmax scores, or the sigmoid
        scores divided by their sum."""
        if self.m.score == "softmax":
            return np.tile(coeff, (len(s), 1))
        tot = s.sum(1, keepdims=True) + 1e-20
        return coeff / tot - (coeff * s).sum(1, keepdims=True) / tot ** 2

    def end_step(self) -> None:
        """The expert bias moves against the step's load (DeepSeek-V3 2.1.2)."""
        if self.m.expert_bias:
            for i, c in self.step_counts.items():
                self.bias[i] += self.m.bias_update_rate * np.sign(c.mean() - c)
        self.step_counts = {}

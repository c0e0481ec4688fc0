"""One-process reference: a plain, unsharded numpy GPT/BERT, forward, backward, Adam/LAMB.

Written independently of the sharded layers (batch-first [B, S, H], separate Wq/Wk/Wv, dense
attention, its own LayerNorm/GeLU/softmax), sharing only what must be identical to compare
at all: the seeded initial weights, data and dropout masks (`seeded`) and the normal CDF of
the erf GeLU (`special`, thesis Eq. 4.1).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..model import seeded
from ..model.config import ModelConfig
from .config import CLIP_EPS, OptimizerConfig
from ..model.special import norm_cdf, norm_pdf

Cache = dict[str, Any]


def _wgrad(x: np.ndarray, d: np.ndarray) -> np.ndarray:
    """sum over batch and positions of x^T d: [B, S, I], [B, S, J] -> [I, J]."""
    return x.reshape(-1, x.shape[-1]).T @ d.reshape(-1, d.shape[-1])


def _ln(x: np.ndarray, g: np.ndarray, b: np.ndarray, eps: float) -> tuple[np.ndarray, Cache]:
    mu = x.mean(-1, keepdims=True)
    xc = x - mu
    rstd = 1.0 / np.sqrt((xc * xc).mean(-1, keepdims=True) + eps)
    xhat = xc * rstd
    return xhat * g + b, {"xhat": xhat, "rstd": rstd, "g": g}


def _ln_back(dy: np.ndarray, c: Cache) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    xhat, rstd = c["xhat"], c["rstd"]
    axes = tuple(range(dy.ndim - 1))
    dg, db = (dy * xhat).sum(axes), dy.sum(axes)
    dxhat = dy * c["g"]
    dx = rstd * (dxhat - dxhat.mean(-1, keepdims=True)
                 - xhat * (dxhat * xhat).mean(-1, keepdims=True))
    return dx, dg, db


class Reference:
    """The whole model on one process; `train_step` does forward, backward and the update."""

    def __init__(self, cfg: ModelConfig, seed: int, opt: OptimizerConfig,
                 global_batch: int, dtype: type = np.float64) -> None:
        self.cfg, self.seed, self.opt, self.global_batch = cfg, seed, opt, global_batch
        self.dtype = dtype
        self.params = seeded.init_full_params(cfg, seed, dtype)
        self.m = {k: np.zeros_like(v) for k, v in self.params.items()}
        self.v = {k: np.zeros_like(v) for k, v in self.params.items()}
        self.step_count = 0

    # -- dropout masks, generated over the whole global batch ------------------------------
    def _hidden_mask(self, it: int, layer: int, site: str) -> np.ndarray | None:
        p = self.cfg.attention_dropout if site == "attn_probs" else self.cfg.hidden_dropout
        if p == 0.0:
            return None
        s, h = self.cfg.seq_len, self.cfg.hidden
        keep = np.stack([seeded.hidden_keep(self.seed, it, layer, site, b, (s, h), p)
                         for b in range(self.global_batch)])
        return keep.astype(self.dtype) / self.dtype(1.0 - p)

    def _probs_mask(self, it: int, layer: int) -> np.ndarray | None:
        p = self.cfg.attention_dropout
        if p == 0.0:
            return None
        keep = np.stack([np.stack([seeded.probs_keep(self.seed, it, layer, b, hd,
                                                     self.cfg.seq_len, p)
                                   for hd in range(self.cfg.heads)])
                         for b in range(self.global_batch)])
        return keep.astype(self.dtype) / self.dtype(1.0 - p)

    # -- sub-layers -------------------------------------------------------------------------
    def _attention(self, x: np.ndarray, i: int, it: int) -> tuple[np.ndarray, Cache]:
        cfg, p = self.cfg, self.params
        pre = f"layers.{i}.attn."
        bsz, s, h = x.shape
        nh, dh = cfg.heads, cfg.head_dim

        def heads(t: np.ndarray) -> np.ndarray:
            return t.reshape(bsz, s, nh, dh).transpose(0, 2, 1, 3)   # (B, nh, S, dh)

        q = heads(x @ p[pre + "wq"] + p[pre + "bq"])
        k = heads(x @ p[pre + "wk"] + p[pre + "bk"])
        v = heads(x @ p[pre + "wv"] + p[pre + "bv"])
        scores = (q @ k.transpose(0, 1, 3, 2)) / np.sqrt(dh)
        if cfg.causal:
            scores = np.where(np.tril(np.ones((s, s), bool)), scores, -np.inf)
        e = np.exp(scores - scores.max(-1, keepdims=True))
        probs = e / e.sum(-1, keepdims=True)
        mask = self._probs_mask(it, i)
        dropped = probs if mask is None else probs * mask
        o = (dropped @ v).transpose(0, 2, 1, 3).reshape(bsz, s, h)
        out = o @ p[pre + "wo"] + p[pre + "bo"]
        return out, {"x": x, "q": q, "k": k, "v": v, "probs": probs, "mask": mask,
                     "dropped": dropped, "o": o}

    def _attention_back(self, dout: np.ndarray, c: Cache, i: int,
                        g: dict[str, np.ndarray]) -> np.ndarray:
        p = self.params
        pre = f"layers.{i}.attn."
        bsz, s, h = dout.shape
        nh, dh = self.cfg.heads, self.cfg.head_dim
        g[pre + "wo"] = _wgrad(c["o"], dout)
        g[pre + "bo"] = dout.sum((0, 1))
        do = (dout @ p[pre + "wo"].T).reshape(bsz, s, nh, dh).transpose(0, 2, 1, 3)
        dv = c["dropped"].transpose(0, 1, 3, 2) @ do
        ddropped = do @ c["v"].transpose(0, 1, 3, 2)
        dprobs = ddropped if c["mask"] is None else ddropped * c["mask"]
        probs = c["probs"]
        dscores = probs * (dprobs - (dprobs * probs).sum(-1, keepdims=True)) / np.sqrt(dh)
        dq = dscores @ c["k"]
        dk = dscores.transpose(0, 1, 3, 2) @ c["q"]
        dx = np.zeros_like(c["x"])
        for name, d in (("q", dq), ("k", dk), ("v", dv)):
            d2 = d.transpose(0, 2, 1, 3).reshape(bsz, s, h)
            g[pre + f"w{name}"] = _wgrad(c["x"], d2)
            g[pre + f"b{name}"] = d2.sum((0, 1))
            dx += d2 @ p[pre + f"w{name}"].T
        return dx

    def _mlp(self, x: np.ndarray, i: int) -> tuple[np.ndarray, Cache]:
        p = self.params
        pre = f"layers.{i}.mlp."
        f = x @ p[pre + "w1"] + p[pre + "b1"]
        act = f * norm_cdf(f)
        return act @ p[pre + "w2"] + p[pre + "b2"], {"x": x, "f": f, "act": act}

    def _mlp_back(self, dout: np.ndarray, c: Cache, i: int,
                  g: dict[str, np.ndarray]) -> np.ndarray:
        p = self.params
        pre = f"layers.{i}.mlp."
        g[pre + "w2"] = _wgrad(c["act"], dout)
        g[pre + "b2"] = dout.sum((0, 1))
        dact = dout @ p[pre + "w2"].T
        f = c["f"]
        df = dact * (norm_cdf(f) + f * norm_pdf(f))
        g[pre + "w1"] = _wgrad(c["x"], df)
        g[pre + "b1"] = df.sum((0, 1))
        return df @ p[pre + "w1"].T

    def _sublayer(self, x: np.ndarray, i: int, it: int, which: str) -> tuple[np.ndarray, Cache]:
        """pre-LN: x + DR(F(LN(x))); post-LN: LN(x + DR(F(x))) (thesis 2.2.2 Add & Norm)."""
        ln = f"layers.{i}." + ("ln1" if which == "attn" else "ln2")
        eps = self.cfg.layernorm_eps
        mask = self._hidden_mask(it, i, "attn_out" if which == "attn" else "mlp_out")
        fn = self._attention if which == "attn" else (lambda t, j, _: self._mlp(t, j))
        c: Cache = {"mask": mask}
        if self.cfg.norm == "pre":
            y, c["ln"] = _ln(x, self.params[ln + ".g"], self.params[ln + ".b"], eps)
            out, c["f"] = fn(y, i, it)
            return x + (out if mask is None else out * mask), c
        out, c["f"] = fn(x, i, it)
        y, c["ln"] = _ln(x + (out if mask is None else out * mask),
                         self.params[ln + ".g"], self.params[ln + ".b"], eps)
        return y, c

    def _sublayer_back(self, dy: np.ndarray, c: Cache, i: int, which: str,
                       g: dict[str, np.ndarray]) -> np.ndarray:
        ln = f"layers.{i}." + ("ln1" if which == "attn" else "ln2")
        back = self._attention_back if which == "attn" else self._mlp_back
        if self.cfg.norm == "pre":
            dout = dy if c["mask"] is None else dy * c["mask"]
            dln = back(dout, c["f"], i, g)
            dx, g[ln + ".g"], g[ln + ".b"] = _ln_back(dln, c["ln"])
            return dy + dx
        dsum, g[ln + ".g"], g[ln + ".b"] = _ln_back(dy, c["ln"])
        dout = dsum if c["mask"] is None else dsum * c["mask"]
        return dsum + back(dout, c["f"], i, g)

    # -- whole model ------------------------------------------------------------------------
    def loss_and_grads(self, tokens: np.ndarray, targets: np.ndarray, it: int
                       ) -> tuple[float, dict[str, np.ndarray]]:
        """Mean next-token cross-entropy over the global batch and its gradients."""
        cfg, p = self.cfg, self.params
        bsz, s = tokens.shape
        x = p["wte"][tokens] + p["wpe"][None, :s]
        if cfg.norm == "post":
            x, c_lne = _ln(x, p["lne.g"], p["lne.b"], cfg.layernorm_eps)
        emb_mask = self._hidden_mask(it, -1, "embed")
        x = x if emb_mask is None else x * emb_mask
        caches = []
        for i in range(cfg.layers):
            x, ca = self._sublayer(x, i, it, "attn")
            x, cm = self._sublayer(x, i, it, "mlp")
            caches.append((ca, cm))
        if cfg.norm == "pre":
            x, c_lnf = _ln(x, p["lnf.g"], p["lnf.b"], cfg.layernorm_eps)
        logits = x @ p["wte"].T                                        # (B, S, V)
        mx = logits.max(-1, keepdims=True)
        lse = mx[..., 0] + np.log(np.exp(logits - mx).sum(-1))
        n = bsz * s
        picked = np.take_along_axis(logits, targets[..., None], -1)[..., 0]
        loss = float((lse - picked).sum() / n)
        # backward
        g: dict[str, np.ndarray] = {}
        dlogits = np.exp(logits - lse[..., None])
        np.put_along_axis(dlogits, targets[..., None],
                          np.take_along_axis(dlogits, targets[..., None], -1) - 1.0, -1)
        dlogits /= n
        g["wte"] = _wgrad(dlogits, x)
        dx = dlogits @ p["wte"]
        if cfg.norm == "pre":
            dx, g["lnf.g"], g["lnf.b"] = _ln_back(dx, c_lnf)
        for i in reversed(range(cfg.layers)):
            ca, cm = caches[i]
            dx = self._sublayer_back(dx, cm, i, "mlp", g)
            dx = self._sublayer_back(dx, ca, i, "attn", g)
        dx = dx if emb_mask is None else dx * emb_mask
        if cfg.norm == "post":
            dx, g["lne.g"], g["lne.b"] = _ln_back(dx, c_lne)
        g["wpe"] = np.zeros_like(p["wpe"])
        g["wpe"][:s] = dx.sum(0)
        np.add.at(g["wte"], tokens.reshape(-1), dx.reshape(-1, cfg.hidden))
        return loss, g

    def update(self, grads: dict[str, np.ndarray]) -> None:
        """One Adam or LAMB step on every parameter (optionally after global-norm clipping)."""
        o = self.opt
        self.step_count += 1
        t = self.step_count
        if o.needs_global_norm or o.name == "lamb":
            norm = float(np.sqrt(sum(float((gr * gr).sum()) for gr in grads.values())))
            if o.clip_grad_norm > 0:
                coeff = o.clip_grad_norm / (norm + CLIP_EPS)
                if coeff < 1.0:
                    grads = {k: gr * coeff for k, gr in grads.items()}
        for name, w in self.params.items():
            gr = grads[name]
            m, v = self.m[name], self.v[name]
            m *= o.beta1
            m += (1.0 - o.beta1) * gr
            v *= o.beta2
            v += (1.0 - o.beta2) * gr * gr
            step = (m / (1.0 - o.beta1 ** t)) / (np.sqrt(v / (1.0 - o.beta2 ** t)) + o.eps)
            if w.ndim == 2 and o.weight_decay > 0:
                step = step + o.weight_decay * w
            if o.name == "lamb":
                wn, sn = float(np.sqrt((w * w).sum())), float(np.sqrt((step * step).sum()))
                step = step * (wn / sn if wn > 0 and sn > 0 else 1.0)
            w -= o.lr * step

    def train_step(self, it: int) -> float:
        """Forward, backward and update on iteration `it`'s global batch; returns the loss."""
        tokens, targets = seeded.batch(self.cfg, self.seed, it, self.global_batch)
        loss, grads = self.loss_and_grads(tokens, targets, it)
        self.update(grads)
        return loss

"""One-process reference: a plain, unsharded numpy GPT/BERT/Llama, forward, backward, Adam/LAMB.

Written independently of the sharded layers (batch-first [B, S, H], separate Wq/Wk/Wv, dense
attention, its own norms, activations, rotary positions and softmax in `reference_blocks`),
sharing only what must be identical to compare at all: the seeded initial weights, data and
dropout masks (`seeded`) and the normal CDF of the erf GeLU (`special`, thesis Eq. 4.1).

Llama-family switches of `ModelConfig`: RMSNorm, SwiGLU (gate `w1`, up `w3`), rotary
positions on q and k, grouped-query attention (`kv_heads`), linear layers without biases and
an untied output layer `lm_head`; every combination, with the GPT and BERT paths unchanged.
Qwen3's attention: heads of `kv_channels` apart from hidden / heads (Wq [H, heads x dh],
Wo [heads x dh, H]) and QK-norm, an RMSNorm of each q and k head over its dh values with
one gain each shared by the heads, before the rotation (HF Qwen3Attention: q_norm, k_norm).

Under an FP8 recipe (`precision.fp8_gemm`) the layers' linear GEMMs run in FP8 as the
sharded layers run them: Wq | Wk | Wv and the gate | up projections as one fused GEMM each
(one tensor, one scale), and the step as its micro-batches (`micro_sets`: each DP rank's
j-th micro-batch together), each a forward, the recipe's update, a backward and its
update, the gradients summed over them.
"""
from __future__ import annotations

import numpy as np

from ..model import seeded
from ..model.config import ModelConfig
from ..precision.fp8_gemm import Fp8Gemm
from ..precision.loss_scale import overflow_expected
from ..precision.matmul import PrecisionGemm
from .config import OptimizerConfig
from .reference_mla import mla_backward, mla_forward
from .reference_moe import ReferenceMoe, TokenLayout
from .reference_blocks import (Cache, adam_or_lamb, apply_rope, apply_rope_back, attention,
                               attention_back, gelu, gelu_grad, layer_norm, layer_norm_back,
                               repeat_kv, rms_norm, rms_norm_back, rope_tables, silu, silu_grad,
                               sum_kv, wgrad)


class Reference:
    """The whole model on one process; `train_step` does forward, backward and the update."""

    def __init__(self, cfg: ModelConfig, seed: int, opt: OptimizerConfig,
                 global_batch: int, dtype: type = np.float64,
                 tokens: TokenLayout | None = None,
                 precision: PrecisionGemm = PrecisionGemm("fp32"),
                 fp8: Fp8Gemm | None = None,
                 micro_sets: list[np.ndarray] | None = None) -> None:
        self.cfg, self.seed, self.opt, self.global_batch = cfg, seed, opt, global_batch
        self.dtype = dtype
        self.mm = precision       # every GEMM, and the attention core's outputs, in it
        self.fp8 = fp8            # the layers' linear GEMMs under an FP8 recipe
        self.micro_sets = micro_sets or [np.arange(global_batch)]   # samples of each
        self.samples = np.arange(global_batch)        # those of the pass running
        # FP16: the loss scaled before the backward, an overflowing step skipped (Megatron)
        self.scaler = opt.loss_scaler() if precision.compute == "fp16" else None
        self.taken = True
        self.params = seeded.init_full_params(cfg, seed, dtype)
        self.m = {k: np.zeros_like(v) for k, v in self.params.items()}
        self.v = {k: np.zeros_like(v) for k, v in self.params.items()}
        self.step_count = 0
        self.last_grads: dict[str, np.ndarray] = {}      # the last step's, before the update
        # rotary cos / sin [S, head_dim] of every position, shared by all layers and heads
        # (MLA: over the decoupled rotated dims)
        self.rope = rope_tables(cfg, cfg.seq_len, dtype, cfg.qk_rope_dim) \
            if cfg.position == "rope" else None
        # experts in place of MLPs (`reference_moe`), routed per rank as the sharded run
        self.moe = None if cfg.moe is None else ReferenceMoe(
            cfg, tokens or TokenLayout(global_batch, 1, 1), global_batch)

    # -- dropout masks, generated over the whole global batch ------------------------------
    def _hidden_mask(self, it: int, layer: int, site: str) -> np.ndarray | None:
        p = self.cfg.attention_dropout if site == "attn_probs" else self.cfg.hidden_dropout
        if p == 0.0:
            return None
        s, h = self.cfg.seq_len, self.cfg.hidden
        keep = np.stack([seeded.hidden_keep(self.seed, it, layer, site, b, (s, h), p)
                         for b in self.samples.tolist()])
        return keep.astype(self.dtype) / self.dtype(1.0 - p)

    def _probs_mask(self, it: int, layer: int) -> np.ndarray | None:
        """(B, heads, S, S): one mask per query head, also under grouped-query attention."""
        p = self.cfg.attention_dropout
        if p == 0.0:
            return None
        keep = np.stack([np.stack([seeded.probs_keep(self.seed, it, layer, b, hd,
                                                     self.cfg.seq_len, p)
                                   for hd in range(self.cfg.heads)])
                         for b in self.samples.tolist()])
        return keep.astype(self.dtype) / self.dtype(1.0 - p)

    # -- linear layers and norms, with or without biases -----------------------------------
    def _gemm(self, w: str) -> PrecisionGemm | Fp8Gemm:
        """The precision of the GEMMs of weight w: a layer's in FP8 under a recipe."""
        return self.fp8 if self.fp8 is not None and w.startswith("layers.") else self.mm

    def _linear(self, x: np.ndarray, w: str, b: str) -> np.ndarray:
        """x @ W (+ bias when the model has biases)."""
        y = self._gemm(w)(w, x, self.params[w])
        return y + self.params[b] if b in self.params else y

    def _fused(self, x: np.ndarray, key: str, names: list[tuple[str, str]]
               ) -> list[np.ndarray]:
        """x @ W for each (W, bias) of `names`: one GEMM of W1 | W2 | ... under FP8 (the
        sharded layer's fused weight, one tensor), else one each."""
        if self.fp8 is None:
            return [self._linear(x, w, b) for w, b in names]
        y = self.fp8(key, x, np.concatenate([self.params[w] for w, _ in names], axis=1))
        parts = np.split(y, np.cumsum([self.params[w].shape[1] for w, _ in names])[:-1], -1)
        return [o + self.params[b] if b in self.params else o
                for o, (_, b) in zip(parts, names)]

    def _fused_back(self, x: np.ndarray, ds: list[np.ndarray], key: str,
                    names: list[tuple[str, str]], g: dict[str, np.ndarray]) -> np.ndarray:
        """Gradients of `_fused` from its input x and its outputs' gradients ds; dx."""
        if self.fp8 is None:
            for d, (w, b) in zip(ds, names):
                self._linear_back(x, d, w, b, g)
            return sum((self._dgrad(w, d) for d, (w, _) in zip(ds, names)),
                       np.zeros_like(x))
        d = np.concatenate(ds, axis=-1)
        gw = self.fp8.accumulate(key, x.reshape(-1, x.shape[-1]).T, d.reshape(-1, d.shape[-1]))
        cuts = np.cumsum([self.params[w].shape[1] for w, _ in names])[:-1]
        for part, dd, (w, b) in zip(np.split(gw, cuts, axis=1), ds, names):
            g[w] = part
            if b in self.params:
                g[b] = dd.sum((0, 1))
        whole = np.concatenate([self.params[w] for w, _ in names], axis=1)
        return self.fp8(key, d, whole.T, ("grad", "weight"))

    def _linear_back(self, x: np.ndarray, d: np.ndarray, w: str, b: str,
                     g: dict[str, np.ndarray]) -> None:
        """The weight's (and bias') gradient of `_linear` from its input x and output grad d."""
        g[w] = self._wgrad(w, x, d)
        if b in self.params:
            g[b] = d.sum((0, 1))

    def _wgrad(self, w: str, x: np.ndarray, d: np.ndarray) -> np.ndarray:
        """x^T d summed over batch and positions, accumulated in fp32 (`main_grad`)."""
        mm = self._gemm(w)
        if mm.exact:
            return wgrad(x, d)
        return mm.accumulate(w, x.reshape(-1, x.shape[-1]).T, d.reshape(-1, d.shape[-1]))

    def _dgrad(self, w: str, d: np.ndarray, transpose: bool = True) -> np.ndarray:
        """d W^T (or d W): a linear layer's input gradient."""
        return self._gemm(w)(w, d, self.params[w].T if transpose else self.params[w],
                             ("grad", "weight"))

    def _norm(self, name: str, x: np.ndarray) -> tuple[np.ndarray, Cache]:
        """The norm `name` (LayerNorm or RMSNorm, `cfg.norm_kind`) over the hidden axis."""
        p, eps = self.params, self.cfg.layernorm_eps
        if self.cfg.norm_kind == "rmsnorm":
            y, c = rms_norm(x, p[name + ".g"], eps)
        else:
            y, c = layer_norm(x, p[name + ".g"], p[name + ".b"], eps)
        return self.mm.round(y), c                # stored in the numerics' dtype

    def _norm_back(self, name: str, dy: np.ndarray, c: Cache,
                   g: dict[str, np.ndarray]) -> np.ndarray:
        """Gradients of `_norm`: its gain's (and LayerNorm bias') into g, dx returned."""
        if self.cfg.norm_kind == "rmsnorm":
            dx, g[name + ".g"] = rms_norm_back(dy, c)
        else:
            dx, g[name + ".g"], g[name + ".b"] = layer_norm_back(dy, c)
        return self.mm.round(dx)

    # -- sub-layers -------------------------------------------------------------------------
    def _attention(self, x: np.ndarray, i: int, it: int) -> tuple[np.ndarray, Cache]:
        """Softmax attention; query head j reads KV head j // (heads // groups) (GQA), q and
        k rotated by their positions under rotary embeddings; or MLA (`reference_mla`)."""
        cfg = self.cfg
        if cfg.mla:
            return mla_forward(self, x, i, it)
        pre = f"layers.{i}.attn."
        bsz, s, _ = x.shape
        nh, ng, dh = cfg.heads, cfg.groups, cfg.head_dim

        def heads(t: np.ndarray, n: int) -> np.ndarray:
            return t.reshape(bsz, s, n, dh).transpose(0, 2, 1, 3)     # (B, n, S, dh)

        q, k, v = (heads(t, n) for t, n in zip(self._fused(x, pre + "qkv", self._qkv(i)),
                                               (nh, ng, ng)))
        qk: Cache = {}
        if cfg.qk_norm:           # over each head's dh values, one gain shared by the heads
            q, qk["q"] = rms_norm(q, self.params[f"layers.{i}.q_norm.g"], cfg.layernorm_eps)
            k, qk["k"] = rms_norm(k, self.params[f"layers.{i}.k_norm.g"], cfg.layernorm_eps)
        if self.rope is not None:
            cos, sin = self.rope[0][:s], self.rope[1][:s]            # (S, dh)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q, k, v = (self.mm.round(t) for t in (q, k, v))       # normed, rotated, biased: stored
        k_all, v_all = repeat_kv(k, nh // ng), repeat_kv(v, nh // ng)   # (B, nh, S, dh)
        o, core = attention(q, k_all, v_all, cfg.causal, self._probs_mask(it, i))
        o = o.transpose(0, 2, 1, 3).reshape(bsz, s, nh * dh)              # (B, S, nh dh)
        o = self.mm.round(o)        # the fused attention kernel's output
        out = self._linear(o, pre + "wo", pre + "bo")
        return out, {"x": x, **core, "o": o, "qk": qk}

    def _attention_back(self, dout: np.ndarray, c: Cache, i: int,
                        g: dict[str, np.ndarray]) -> np.ndarray:
        if self.cfg.mla:
            return mla_backward(self, dout, c, i, g)
        pre = f"layers.{i}.attn."
        bsz, s, h = dout.shape
        nh, dh, rep = self.cfg.heads, self.cfg.head_dim, self.cfg.heads // self.cfg.groups
        self._linear_back(c["o"], dout, pre + "wo", pre + "bo", g)
        do = self._dgrad(pre + "wo", dout).reshape(bsz, s, nh, dh).transpose(0, 2, 1, 3)
        dq, dk, dv = attention_back(do, c)                             # (B, nh, S, dh)
        dk, dv = sum_kv(dk, rep), sum_kv(dv, rep)                      # (B, groups, S, dh)
        dq, dk, dv = (self.mm.round(t) for t in (dq, dk, dv))  # the fused kernel's outputs
        if self.rope is not None:
            cos, sin = self.rope[0][:s], self.rope[1][:s]
            dq, dk = apply_rope_back(dq, cos, sin), apply_rope_back(dk, cos, sin)
        if self.cfg.qk_norm:
            dq, g[f"layers.{i}.q_norm.g"] = rms_norm_back(dq, c["qk"]["q"])
            dk, g[f"layers.{i}.k_norm.g"] = rms_norm_back(dk, c["qk"]["k"])
        dq, dk = self.mm.round(dq), self.mm.round(dk)
        ds = [d.transpose(0, 2, 1, 3).reshape(bsz, s, -1) for d in (dq, dk, dv)]  # (B, S, n dh)
        return self._fused_back(c["x"], ds, pre + "qkv", self._qkv(i), g)

    @staticmethod
    def _qkv(i: int) -> list[tuple[str, str]]:
        return [(f"layers.{i}.attn.w{n}", f"layers.{i}.attn.b{n}") for n in "qkv"]

    @staticmethod
    def _fc1(i: int, gated: bool) -> list[tuple[str, str]]:
        """FC-1's weights: W1 (the gate under SwiGLU) and W3 (the up projection)."""
        return [(f"layers.{i}.mlp.w{n}", f"layers.{i}.mlp.b{n}") for n in ("13" if gated else "1")]

    def _experts(self, i: int) -> bool:
        return self.moe is not None and self.moe.m.is_moe(i)

    def _mlp(self, x: np.ndarray, i: int) -> tuple[np.ndarray, Cache]:
        """GeLU: W2 gelu(W1 x); SwiGLU: W2 (silu(W1 x) * W3 x), W1 the gate, W3 the up; or
        the layer's experts."""
        if self.moe is not None and self._experts(i):
            return self.moe.forward(self.params, x, i)
        pre = f"layers.{i}.mlp."
        fc1 = self._fused(x, pre + "fc1", self._fc1(i, self.cfg.gated))    # (B, S, ffn) each
        f = fc1[0]
        c: Cache = {"x": x, "f": f}
        if self.cfg.gated:
            c["up"] = fc1[1]
            c["act"] = self.mm.round(silu(f) * c["up"])      # the activation's output, stored
        else:
            c["act"] = self.mm.round(gelu(f))
        return self._linear(c["act"], pre + "w2", pre + "b2"), c

    def _mlp_back(self, dout: np.ndarray, c: Cache, i: int,
                  g: dict[str, np.ndarray]) -> np.ndarray:
        if self.moe is not None and self._experts(i):
            return self.moe.backward(self.params, dout, c, i, g)
        pre = f"layers.{i}.mlp."
        self._linear_back(c["act"], dout, pre + "w2", pre + "b2", g)
        dact = self._dgrad(pre + "w2", dout)
        f = c["f"]
        if not self.cfg.gated:
            ds = [self.mm.round(dact * gelu_grad(f))]
        else:
            ds = [self.mm.round(t) for t in (dact * c["up"] * silu_grad(f), dact * silu(f))]
        return self._fused_back(c["x"], ds, pre + "fc1", self._fc1(i, self.cfg.gated), g)

    def _sublayer(self, x: np.ndarray, i: int, it: int, which: str) -> tuple[np.ndarray, Cache]:
        """pre-LN: x + DR(F(LN(x))); post-LN: LN(x + DR(F(x))) (thesis 2.2.2 Add & Norm)."""
        ln = f"layers.{i}." + ("ln1" if which == "attn" else "ln2")
        mask = self._hidden_mask(it, i, "attn_out" if which == "attn" else "mlp_out")
        fn = self._attention if which == "attn" else (lambda t, j, _: self._mlp(t, j))
        c: Cache = {"mask": mask}
        if self.cfg.norm == "pre":
            y, c["ln"] = self._norm(ln, x)
            out, c["f"] = fn(y, i, it)
            return self.mm.round(x + (out if mask is None else out * mask)), c   # residual
        out, c["f"] = fn(x, i, it)
        y, c["ln"] = self._norm(ln, self.mm.round(x + (out if mask is None else out * mask)))
        return y, c

    def _sublayer_back(self, dy: np.ndarray, c: Cache, i: int, which: str,
                       g: dict[str, np.ndarray]) -> np.ndarray:
        ln = f"layers.{i}." + ("ln1" if which == "attn" else "ln2")
        back = self._attention_back if which == "attn" else self._mlp_back
        if self.cfg.norm == "pre":
            dout = dy if c["mask"] is None else dy * c["mask"]
            dln = back(dout, c["f"], i, g)
            return self.mm.round(dy + self._norm_back(ln, dln, c["ln"], g))
        dsum = self._norm_back(ln, dy, c["ln"], g)
        dout = dsum if c["mask"] is None else dsum * c["mask"]
        return self.mm.round(dsum + back(dout, c["f"], i, g))

    # -- whole model ------------------------------------------------------------------------
    def loss_and_grads(self, tokens: np.ndarray, targets: np.ndarray, it: int,
                       n: int | None = None) -> tuple[float, dict[str, np.ndarray]]:
        """Next-token cross-entropy summed over the samples / n (all the tokens of the
        step: the samples' share of its mean) and its gradients."""
        cfg, p = self.cfg, self.params
        bsz, s = tokens.shape
        n = bsz * s if n is None else n
        learned = cfg.position == "learned"
        head = "wte" if cfg.tied_embeddings else "lm_head"     # the output layer's weight
        x = p["wte"][tokens] + p["wpe"][None, :s] if learned else p["wte"][tokens]
        if cfg.norm == "post":
            x, c_lne = self._norm("lne", x)
        emb_mask = self._hidden_mask(it, -1, "embed")
        x = self.mm.round(x if emb_mask is None else x * emb_mask)    # the embedding's output
        caches = []
        for i in range(cfg.layers):
            x, ca = self._sublayer(x, i, it, "attn")
            x, cm = self._sublayer(x, i, it, "mlp")
            caches.append((ca, cm))
        if cfg.norm == "pre":
            x, c_lnf = self._norm("lnf", x)
        logits = self.mm(head, x, p[head].T)                          # (B, S, V)
        if self.fp8 is not None:
            self.fp8.end_pass(backward=False)
        mx = logits.max(-1, keepdims=True)
        lse = mx[..., 0] + np.log(np.exp(logits - mx).sum(-1))
        picked = np.take_along_axis(logits, targets[..., None], -1)[..., 0]
        loss = float((lse - picked).sum() / n)
        # backward
        g: dict[str, np.ndarray] = {}
        dlogits = np.exp(logits - lse[..., None])
        np.put_along_axis(dlogits, targets[..., None],
                          np.take_along_axis(dlogits, targets[..., None], -1) - 1.0, -1)
        dlogits /= n
        if self.scaler is not None:
            dlogits *= self.scaler.scale
        g[head] = self._wgrad(head, dlogits, x)
        dx = self._dgrad(head, dlogits, transpose=False)
        if cfg.norm == "pre":
            dx = self._norm_back("lnf", dx, c_lnf, g)
        for i in reversed(range(cfg.layers)):
            ca, cm = caches[i]
            dx = self._sublayer_back(dx, cm, i, "mlp", g)
            dx = self._sublayer_back(dx, ca, i, "attn", g)
        if self.fp8 is not None:
            self.fp8.end_pass(backward=True)
        dx = dx if emb_mask is None else dx * emb_mask
        if cfg.norm == "post":
            dx = self._norm_back("lne", dx, c_lne, g)
        if learned:
            g["wpe"] = np.zeros_like(p["wpe"])
            g["wpe"][:s] = dx.sum(0)
        if not cfg.tied_embeddings:
            g["wte"] = np.zeros_like(p["wte"])
        np.add.at(g["wte"], tokens.reshape(-1), dx.reshape(-1, cfg.hidden))
        return loss, g

    def _micro_batches(self, tokens: np.ndarray, targets: np.ndarray, it: int
                       ) -> tuple[float, dict[str, np.ndarray]]:
        """The step's loss and gradients: the whole batch at once, or under FP8 its
        micro-batches in order (the recipe's scales change between them)."""
        if self.fp8 is None:
            return self.loss_and_grads(tokens, targets, it)
        self.fp8.new_step()
        loss, grads = 0.0, dict[str, np.ndarray]()
        for idx in self.micro_sets:
            self.samples = idx
            part, g = self.loss_and_grads(tokens[idx], targets[idx], it, tokens.size)
            loss += part
            grads = {k: grads[k] + v if k in grads else v for k, v in g.items()}
        self.samples = np.arange(self.global_batch)
        return loss, grads

    def update(self, grads: dict[str, np.ndarray]) -> None:
        """One Adam or LAMB step on every parameter (optionally after global-norm clipping)."""
        self.step_count += 1
        adam_or_lamb(self.params, grads, self.m, self.v, self.opt, self.step_count)

    def train_step(self, it: int) -> float:
        """Forward, backward and update on iteration `it`'s global batch; returns the loss."""
        tokens, targets = seeded.batch(self.cfg, self.seed, it, self.global_batch)
        with overflow_expected(self.scaler is not None):
            loss, grads = self._micro_batches(tokens, targets, it)
        if self.scaler is not None:          # unscaled in fp32; an inf or NaN skips the step
            grads = {k: g * (1.0 / self.scaler.scale) for k, g in grads.items()}
            self.taken = self.scaler.update(not all(np.all(np.isfinite(g))
                                                    for g in grads.values()))
        self.last_grads = grads
        if self.taken:
            self.update(grads)
        if self.moe is not None:
            self.moe.end_step()
        return loss

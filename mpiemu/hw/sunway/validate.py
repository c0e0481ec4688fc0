"""The seeds' figures beside the model's: SWattention vs standard attention (SWA 4), memory
limits (SWA 4.2, 4.4) and SwFormer's scheduling gains (SWF App. A, C). Costs only.

`required` marks the speedups the acceptance asks to be within 20% of the seed.
"""
from __future__ import annotations

from typing import Any

from .gemm import min_tile
from .layer import LayerShape, layer_ops
from .model import AttnShape, SunwayModel, SunwayOutOfMemory
from .schedule import Op, Schedule, schedule
from .standard import standard_footprint_bytes

B, N = 3, 8                                            # SWA 4.2: 24 heads, 4 per CG
SEQS = (1024, 2048, 4096, 8192, 16384)
GPT3 = dict(hidden=4096, heads=32, head_dim=128, ffn=16384, seq=2048, tp=8)   # s2t8


def attention_rows(m: SunwayModel, seqs: tuple[int, ...]) -> list[dict[str, Any]]:
    """SWattention and standard attention at B=3, N=8 for every (dtype, H, S, pass)."""
    rows = []
    for dtype in ("fp32", "fp16"):
        for h in (64, 128):
            for s in seqs:
                shape = AttnShape(B, N, s, h, dtype)
                for p in ("fwd", "bwd"):
                    sw = m.attention(p, shape)
                    assert sw.head is not None
                    try:
                        st: float | None = m.attention(p, shape, kernel="standard").time_s
                    except SunwayOutOfMemory:
                        st = None
                    rows.append(dict(dtype=dtype, H=h, S=s, pass_=p, br=sw.head.blocks.br,
                                     bc=sw.head.blocks.bc, sw_ms=sw.time_s * 1e3,
                                     sw_tflops=sw.tflops,
                                     std_ms=None if st is None else st * 1e3,
                                     speedup=None if st is None else st / sw.time_s))
    return rows


def _mean_speedup(rows: list[dict[str, Any]], dtype: str, h: int, p: str,
                  seqs: tuple[int, ...]) -> float:
    vals = [r["speedup"] for r in rows if r["dtype"] == dtype and r["H"] == h
            and r["pass_"] == p and r["S"] in seqs]
    return sum(vals) / len(vals)


def _time(m: SunwayModel, p: str, shape: AttnShape, **kw: Any) -> float:
    return m.attention(p, shape, **kw).time_s


def seed_rows(m: SunwayModel, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each figure of the seeds beside ours; `required` marks the acceptance speedups."""
    out: list[dict[str, Any]] = []

    def add(what: str, ours: float | tuple[float, float], theirs: float | tuple[float, float],
            where: str, required: bool = False) -> None:
        """A row; ranges compare end to end, a value against a range against its nearer end."""
        lo, hi = theirs if isinstance(theirs, tuple) else (theirs, theirs)
        rel: float | None = None
        if isinstance(ours, tuple):
            diff = f"{ours[0] / lo - 1:+.0%} / {ours[1] / hi - 1:+.0%}"
            shown = f"{ours[0]:.2f}-{ours[1]:.2f}"
        else:
            ref = lo if ours < lo else hi if ours > hi else ours
            rel = ours / ref - 1
            diff, shown = f"{rel:+.0%}", f"{ours:.2f}"
        out.append(dict(figure=what, ours=shown, seed=f"{lo}-{hi}" if lo != hi else f"{lo}",
                        diff=diff, rel=rel, source=where, required=required))

    k1_8, k4_8 = (1024, 2048, 4096, 8192), (4096, 8192)
    for p, tag, vals in (("fwd", "forward", (3.42, 2.21)), ("bwd", "backward", (1.94, 1.33))):
        for h, v in zip((64, 128), vals):
            add(f"FP32 {tag} speedup, H={h}, mean S=1k-8k", _mean_speedup(rows, "fp32", h, p,
                k1_8), v, "SWA 4.2", True)
    for h, v in ((64, 2.74), (128, 2.35)):
        add(f"FP16 forward speedup, H={h}, mean S=4k,8k", _mean_speedup(rows, "fp16", h, "fwd",
            k4_8), v, "SWA 4.2", True)
    shape = AttnShape(B, N, 2048, 128)
    add("FP32 forward TFLOPS, S=2048, H=128", m.attention("fwd", shape).tflops, 2.4, "SWA 4.1")
    for h, rng in ((64, (2.81, 3.22)), (128, (1.85, 2.32))):
        got = [r["speedup"] for r in rows if r["dtype"] == "fp16" and r["H"] == h
               and r["pass_"] == "bwd" and r["S"] > 1024 and r["speedup"] is not None]
        add(f"FP16 backward speedup, H={h}, S=2k-16k (range)", (min(got), max(got)), rng,
            "SWA 4.2")
    for h, rng in ((64, (2.35, 2.44)), (128, (1.51, 1.65))):
        sp = []
        for s in k1_8:
            a = AttnShape(B, N, s, h)
            sp.append(sum(_time(m, p, a, kernel="standard") for p in ("fwd", "bwd"))
                      / sum(_time(m, p, a) for p in ("fwd", "bwd")))
        add(f"FP32 fwd+bwd speedup, H={h}, mean S=1k-8k", sum(sp) / len(sp), rng, "SWA 4.2")
    a16 = AttnShape(B, N, 16384, 128, "fp16")
    add("FP16 backward TFLOPS, S=16k, H=128", m.attention("bwd", a16).tflops, 5.44, "SWA 4.2")
    mixed = [sum(_time(m, p, AttnShape(B, N, s, 128)) for p in ("fwd", "bwd"))
             / sum(_time(m, p, AttnShape(B, N, s, 128, "fp16")) for p in ("fwd", "bwd"))
             for s in (4096, 8192, 16384)]
    add("mixed precision over FP32, H=128, S=4k-16k (mean)", sum(mixed) / 3, (1.73, 1.86),
        "SWA 4.2")
    for s, v in ((1024, 1.18), (8192, 2.76)):
        a = AttnShape(B, N, s, 128)
        t = _time(m, "fwd", a) + _time(m, "bwd", a)
        add(f"FP32 fwd+bwd TFLOPS, S={s}, H=128", 3 * a.flops("fwd") / t / 1e12, v, "SWA 4.2")
    for p, tag in (("fwd", "forward"), ("bwd", "backward")):
        a = AttnShape(3, 4, 2048, 128)
        add(f"async over blocking DMA, {tag}, B=3 N=4 S=2048",
            _time(m, p, a, async_dma=False) / _time(m, p, a), 1.1, "SWA 4.3")
    for s, v in ((2048, 0.24), (4096, 0.16)):
        hd = m.attention("bwd", AttnShape(3, 4, s, 128)).head
        assert hd is not None                     # SWattention costs carry their head
        add(f"RMA reduction share of backward, S={s}", hd.rma_s / hd.time_s, v, "SWA 4.3")
    g = m.gemm(2048, 128, 2048, dtype="fp32", batch=B * N)
    add("baseline 2nd matmul TFLOPS, S=2048, H=128", g.flops / g.time_s / 1e12, 6.3, "SWA 4.1")
    return out


def memory_rows(m: SunwayModel) -> list[dict[str, Any]]:
    """Where standard attention runs out of the 96 GB (SWA 4.2 and 4.4)."""
    cap = m.sw.dram_capacity_bytes
    rows = []
    for s in (8192, 16384):
        need = standard_footprint_bytes(B, N, s, 128, "fp32")
        rows.append(dict(case=f"standard attention, B=3 N=8 S={s} H=128 FP32, training step",
                         need_GB=need / 1e9, fits=need <= cap))
    for name, layers in (("2.1B", 16), ("3.9B", 32)):
        # SWA 4.4: hidden 3072, 24 heads, TP=4 -> 6 heads, batch 1, S=8k, FP32 Adam states
        params = layers * 12 * 3072 ** 2 / 4
        saved = layers * standard_footprint_bytes(1, 6, 8192, 128, "fp32", training=False)
        peak = standard_footprint_bytes(1, 6, 8192, 128, "fp32") - \
            standard_footprint_bytes(1, 6, 8192, 128, "fp32", training=False)
        need = 16 * params + saved + peak
        rows.append(dict(case=f"GPT {name} ({layers} layers) S=8k without SWattention, "
                              "saved scores of all layers + Adam states", need_GB=need / 1e9,
                         fits=need <= cap))
    return rows


def layer_schedules(m: SunwayModel, batch: int, pass_: str, coarse: bool
                    ) -> tuple[list[Op], dict[str, Schedule]]:
    """The GPT-3 6.7B-like layer (s2t8, micro-batch `batch`) under intra, OPT2 and KA;
    `coarse` applies a micro-kernel constraint of tiles >= 512 x 512."""
    shape = LayerShape(batch=batch, dtype="fp32", **GPT3)
    ops = (layer_ops(m, shape, pass_, valid=min_tile(512, 512)) if coarse
           else layer_ops(m, shape, pass_))
    return ops, {p: schedule(ops, m.sw.core_groups, p) for p in ("intra", "opt2", "ka")}


def schedule_rows(m: SunwayModel) -> list[dict[str, Any]]:
    """OPT2's GEMM-kernel speedup and KA's layer speedup on a GPT-3 6.7B-like layer."""
    rows = []
    for coarse in (False, True):
        for batch in (4, 1):
            for p in ("bwd", "fwd"):
                ops, sc = layer_schedules(m, batch, p, coarse)
                gemm = {k: v.op_time(["gemm"], ops) for k, v in sc.items()}
                rows.append(dict(tiles="min 512x512" if coarse else "8x8 mesh", batch=batch,
                                 pass_=p, intra_ms=sc["intra"].makespan * 1e3,
                                 opt2_ms=sc["opt2"].makespan * 1e3,
                                 ka_ms=sc["ka"].makespan * 1e3,
                                 opt2_gemm_speedup=gemm["intra"] / gemm["opt2"],
                                 ka_speedup=sc["intra"].makespan / sc["ka"].makespan))
    return rows


def fusion_rows(m: SunwayModel) -> list[dict[str, Any]]:
    """Tile fusion on the layer's GEMM shapes (SWF App. A.2: ~5%)."""
    fused = SunwayModel(m.spec, m.sw, tile_fusion=True)
    t = 4 * GPT3["seq"]
    h, f, tp = GPT3["hidden"], GPT3["ffn"], GPT3["tp"]
    shapes = [(t, 3 * h // tp, h), (t, h, h // tp), (t, f // tp, h), (t, h, f // tp),
              (f // tp, h, t), (h // tp, h, t)]
    return [dict(m=a, n=b, k=c, pad_free_ms=m.gemm(a, b, c, dtype="fp32").time_s * 1e3,
                 fused_ms=fused.gemm(a, b, c, dtype="fp32").time_s * 1e3,
                 tail_idle_cgs=m.gemm(a, b, c, dtype="fp32").tail_idle_cgs)
            for a, b, c in shapes]



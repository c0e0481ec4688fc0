"""The Sunway seeds' figures beside the model's: SWattention vs standard attention (SWA 4),
memory limits (SWA 4.2, 4.4) and SwFormer's scheduling gains (SWF App. A, C). Costs only; the
seeds' setups and figures come from `sunway.toml`.

`required` marks the speedups the acceptance asks to be within tolerance of the seed.
"""
from __future__ import annotations

from typing import Any

from ..devices.sunway.gemm import min_tile
from ..devices.sunway.layer import LayerShape, layer_ops
from ..devices.sunway.cost import AttnShape, SunwayCost, SunwayOutOfMemory
from ..devices.sunway.schedule import Op, Schedule, schedule
from ..devices.sunway.standard import standard_footprint_bytes
from .common import load_figures

FIG = load_figures("sunway")
B, N = int(FIG["batch"]), int(FIG["heads"])            # SWA 4.2: 24 heads, 4 per CG
SEQS: tuple[int, ...] = tuple(FIG["seqs"].value)
GPT3: dict[str, int] = dict(FIG["gpt3_layer"].value)   # SWF s2t8


def _pair(name: str) -> tuple[Any, Any]:
    """A figure given per head dim {h64, h128} as (H=64, H=128)."""
    v = FIG[name].value
    return v["h64"], v["h128"]


def _range(v: Any) -> tuple[float, float]:
    return float(v[0]), float(v[1])


def _where(name: str) -> str:
    return FIG[name].source.split(":")[0]


def attention_rows(m: SunwayCost, seqs: tuple[int, ...]) -> list[dict[str, Any]]:
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


def _time(m: SunwayCost, p: str, shape: AttnShape, **kw: Any) -> float:
    return m.attention(p, shape, **kw).time_s


def seed_rows(m: SunwayCost, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
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

    k1_8, k4_8 = SEQS[:4], SEQS[2:4]
    for p, tag, name in (("fwd", "forward", "fp32_fwd_speedup"),
                         ("bwd", "backward", "fp32_bwd_speedup")):
        for h, v in zip((64, 128), _pair(name)):
            add(f"FP32 {tag} speedup, H={h}, mean S=1k-8k", _mean_speedup(rows, "fp32", h, p,
                k1_8), v, _where(name), True)
    for h, v in zip((64, 128), _pair("fp16_fwd_speedup")):
        add(f"FP16 forward speedup, H={h}, mean S=4k,8k", _mean_speedup(rows, "fp16", h, "fwd",
            k4_8), v, _where("fp16_fwd_speedup"), True)
    shape = AttnShape(B, N, 2048, 128)
    add("FP32 forward TFLOPS, S=2048, H=128", m.attention("fwd", shape).tflops,
        float(FIG["fp32_fwd_tflops_s2048"]), _where("fp32_fwd_tflops_s2048"))
    for h, rng in zip((64, 128), _pair("fp16_bwd_speedup_range")):
        got = [r["speedup"] for r in rows if r["dtype"] == "fp16" and r["H"] == h
               and r["pass_"] == "bwd" and r["S"] > 1024 and r["speedup"] is not None]
        add(f"FP16 backward speedup, H={h}, S=2k-16k (range)", (min(got), max(got)),
            _range(rng), _where("fp16_bwd_speedup_range"))
    for h, rng in zip((64, 128), _pair("fp32_fwdbwd_speedup_range")):
        sp = []
        for s in k1_8:
            a = AttnShape(B, N, s, h)
            sp.append(sum(_time(m, p, a, kernel="standard") for p in ("fwd", "bwd"))
                      / sum(_time(m, p, a) for p in ("fwd", "bwd")))
        add(f"FP32 fwd+bwd speedup, H={h}, mean S=1k-8k", sum(sp) / len(sp), _range(rng),
            _where("fp32_fwdbwd_speedup_range"))
    a16 = AttnShape(B, N, 16384, 128, "fp16")
    add("FP16 backward TFLOPS, S=16k, H=128", m.attention("bwd", a16).tflops,
        float(FIG["fp16_bwd_tflops_s16k"]), _where("fp16_bwd_tflops_s16k"))
    mixed = [sum(_time(m, p, AttnShape(B, N, s, 128)) for p in ("fwd", "bwd"))
             / sum(_time(m, p, AttnShape(B, N, s, 128, "fp16")) for p in ("fwd", "bwd"))
             for s in (4096, 8192, 16384)]
    add("mixed precision over FP32, H=128, S=4k-16k (mean)", sum(mixed) / 3,
        _range(FIG["mixed_over_fp32"].value), _where("mixed_over_fp32"))
    for s, v in FIG["fp32_fwdbwd_tflops"].value.items():
        a = AttnShape(B, N, int(s[1:]), 128)
        t = _time(m, "fwd", a) + _time(m, "bwd", a)
        add(f"FP32 fwd+bwd TFLOPS, S={int(s[1:])}, H=128", 3 * a.flops("fwd") / t / 1e12, v,
            _where("fp32_fwdbwd_tflops"))
    for p, tag in (("fwd", "forward"), ("bwd", "backward")):
        a = AttnShape(3, 4, 2048, 128)
        add(f"async over blocking DMA, {tag}, B=3 N=4 S=2048",
            _time(m, p, a, async_dma=False) / _time(m, p, a), float(FIG["async_dma_gain"]),
            _where("async_dma_gain"))
    for s, v in FIG["rma_share"].value.items():
        hd = m.attention("bwd", AttnShape(3, 4, int(s[1:]), 128)).head
        assert hd is not None                     # SWattention costs carry their head
        add(f"RMA reduction share of backward, S={int(s[1:])}", hd.rma_s / hd.time_s, v,
            _where("rma_share"))
    g = m.gemm(2048, 128, 2048, dtype="fp32", batch=B * N)
    add("baseline 2nd matmul TFLOPS, S=2048, H=128", g.flops / g.time_s / 1e12,
        float(FIG["baseline_matmul_tflops"]), _where("baseline_matmul_tflops"))
    return out


def memory_rows(m: SunwayCost) -> list[dict[str, Any]]:
    """Where standard attention runs out of the 96 GB (SWA 4.2 and 4.4)."""
    cap = m.sw.dram_capacity_bytes
    rows = []
    for s in (8192, 16384):
        need = standard_footprint_bytes(B, N, s, 128, "fp32")
        rows.append(dict(case=f"standard attention, B=3 N=8 S={s} H=128 FP32, training step",
                         need_GB=need / 1e9, fits=need <= cap))
    g = FIG["swa44_model"].value
    hl, sq, hd = g["heads"] // g["tp"], g["seq"], g["hidden"] // g["heads"]
    for name, layers in (("2.1B", g["layers_small"]), ("3.9B", g["layers_big"])):
        # SWA 4.4: heads split over TP, batch 1, FP32 Adam states
        params = layers * 12 * g["hidden"] ** 2 / g["tp"]
        saved = layers * standard_footprint_bytes(1, hl, sq, hd, "fp32", training=False)
        peak = standard_footprint_bytes(1, hl, sq, hd, "fp32") - \
            standard_footprint_bytes(1, hl, sq, hd, "fp32", training=False)
        need = 16 * params + saved + peak
        rows.append(dict(case=f"GPT {name} ({layers} layers) S={sq} without SWattention, "
                              "saved scores of all layers + Adam states", need_GB=need / 1e9,
                         fits=need <= cap))
    return rows


def layer_schedules(m: SunwayCost, batch: int, pass_: str, coarse: bool
                    ) -> tuple[list[Op], dict[str, Schedule]]:
    """The GPT-3 6.7B-like layer (s2t8, micro-batch `batch`) under intra, OPT2 and KA;
    `coarse` applies a micro-kernel constraint of tiles >= 512 x 512."""
    shape = LayerShape(batch=batch, dtype="fp32", **GPT3)
    ops = (layer_ops(m, shape, pass_, valid=min_tile(512, 512)) if coarse
           else layer_ops(m, shape, pass_))
    return ops, {p: schedule(ops, m.sw.core_groups, p) for p in ("intra", "opt2", "ka")}


def schedule_rows(m: SunwayCost) -> list[dict[str, Any]]:
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


def fusion_rows(m: SunwayCost) -> list[dict[str, Any]]:
    """Tile fusion on the layer's GEMM shapes (SWF App. A.2: ~5%)."""
    fused = SunwayCost(m.spec, m.sw, tile_fusion=True)
    t = 4 * GPT3["seq"]
    h, f, tp = GPT3["hidden"], GPT3["ffn"], GPT3["tp"]
    shapes = [(t, 3 * h // tp, h), (t, h, h // tp), (t, f // tp, h), (t, h, f // tp),
              (f // tp, h, t), (h // tp, h, t)]
    return [dict(m=a, n=b, k=c, pad_free_ms=m.gemm(a, b, c, dtype="fp32").time_s * 1e3,
                 fused_ms=fused.gemm(a, b, c, dtype="fp32").time_s * 1e3,
                 tail_idle_cgs=m.gemm(a, b, c, dtype="fp32").tail_idle_cgs)
            for a, b, c in shapes]



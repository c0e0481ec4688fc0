"""`mpiemu report softmax`: seed 004's softmax recomposition (SD, SDF) beside baseline and
flash attention, for BERT-Large and GPT-Neo-1.3B inference on the GPUs of its Table 1.

Every layer is a list of kernels from the per-kernel models the training ranks use:
`devices.gemm` for the four projections and the attention GEMMs (SDF's with its fused epilogue /
prologue), `devices.attention_gpu` for the attention variants, `devices.kernels` (Megatron-fused) for
LayerNorm, bias + GeLU and bias + residual. Costs only (one process, a few seconds); the
golden test regenerates every CSV. Setups and the seed's figures: `softmax.toml`.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from ..devices import attention_gpu as ag
from ..devices import kernels as hk
from ..devices.cost import GpuCost
from ..devices.presets import load_device
from ..devices.specs import DeviceSpec
from ..devices.specs import dtype_bytes
from .common import Golden, Row, load_figures

VARIANTS = ("baseline", "sd", "sdf", "flash")
GROUPS = ("projection GEMMs", "attention GEMMs", "softmax", "flash", "other")


@dataclass(frozen=True)
class Net:
    """A transformer of the study (softmax.toml `models`)."""

    name: str
    layers: int
    hidden: int
    heads: int
    ffn: int
    causal: bool
    local_every: int        # every n-th layer is local (block-sparse) attention; 0: none
    window: int

    def is_local(self, i: int) -> bool:
        return self.local_every > 0 and i % self.local_every == self.local_every - 1


def nets() -> list[Net]:
    return [Net(**m) for m in load_figures("softmax")["models"].value]


def device(gpu: str) -> DeviceSpec:
    """The GPU as the seed measured it: SM clock locked to the preset's base clock."""
    spec = load_device(gpu)
    if load_figures("softmax")["measurement_clock"].value != "base":
        return spec
    return spec.at_base_clock()


def _attn_shape(net: Net, local: bool, seq: int, batch: int, e: int) -> ag.AttnShape:
    block = int(load_figures("softmax")["local_block"])
    if local:
        keys = (net.window // block + 1) * block
        return ag.AttnShape(batch * net.heads, seq, keys, net.hidden // net.heads, e,
                            causal=net.causal, local_block=block)
    return ag.AttnShape(batch * net.heads, seq, seq, net.hidden // net.heads, e,
                        causal=net.causal)


def layer_kernels(model: GpuCost, net: Net, local: bool, variant: str, seq: int, batch: int,
                  dtype: str) -> list[tuple[str, str, float, float]]:
    """(group, kernel, time s, DRAM bytes) of one inference layer, in launch order."""
    e, t, h = dtype_bytes(dtype), seq * batch, net.hidden
    out: list[tuple[str, str, float, float]] = []

    def gemm(name: str, m: int, n: int, k: int) -> None:
        g = model.gemm(m, n, k, dtype=dtype)
        out.append(("projection GEMMs", name, g.time_s, g.dram_bytes))

    def mem(name: str, ks: list[hk.Kernel]) -> None:
        for k in ks:
            out.append(("other", f"{name}{'.' + k.tag if k.tag else ''}",
                        model.elementwise_s(k.read_bytes, k.write_bytes, k.flops,
                                            sfu_ops=k.sfu_ops, bw_util=k.bw_util),
                        k.dram_bytes))

    mem("ln1", hk.layernorm(t, h, e))
    gemm("qkv", t, 3 * h, h)
    a = _attn_shape(net, local, seq, batch, e)
    for step in ag.steps(model, a, variant, "fused", dtype):
        time, _, dram = ag.step_cost(model, step, dtype)
        group = ("attention GEMMs" if isinstance(step, ag.GemmStep) else
                 "flash" if isinstance(step, ag.FlashStep) else "softmax")
        out.append((group, step.name, time, dram))
    gemm("proj", t, h, h)
    mem("residual1", hk.bias_dropout_add(t, h, e, False, "fused"))
    mem("ln2", hk.layernorm(t, h, e))
    gemm("fc1", t, net.ffn, h)
    mem("bias_gelu", hk.bias_gelu(t, net.ffn, e, "fused"))
    gemm("fc2", t, h, net.ffn)
    mem("residual2", hk.bias_dropout_add(t, h, e, False, "fused"))
    return out


def net_kernels(model: GpuCost, net: Net, variant: str) -> list[tuple[str, str, float, float]]:
    fig = load_figures("softmax")
    seq, batch, dtype = int(fig["seq_len"]), int(fig["batch"]), str(fig["dtype"].value)
    dense = layer_kernels(model, net, False, variant, seq, batch, dtype)
    local = layer_kernels(model, net, True, variant, seq, batch, dtype)
    n_local = sum(net.is_local(i) for i in range(net.layers))
    return dense * (net.layers - n_local) + local * n_local


def variant_rows() -> list[Row]:
    """Per model, GPU and variant: time and DRAM traffic by kernel group."""
    fig = load_figures("softmax")
    rows: list[Row] = []
    for gpu in fig["gpus"].value:
        model = GpuCost(device(gpu))
        for net in nets():
            base = 0.0
            for variant in VARIANTS:
                ks = net_kernels(model, net, variant)
                t = sum(k[2] for k in ks)
                base = base or t
                by_t: dict[str, float] = defaultdict(float)
                by_b: dict[str, float] = defaultdict(float)
                for g, _, time, dram in ks:
                    by_t[g] += time
                    by_b[g] += dram
                rows.append({"model": net.name, "gpu": gpu, "variant": variant,
                             "time_ms": t * 1e3, "dram_GB": sum(by_b.values()) / 1e9,
                             "speedup": base / t, "softmax_share": by_t["softmax"] / t,
                             **{f"{g.split()[0]}_ms": by_t[g] * 1e3 for g in GROUPS},
                             "softmax_dram_GB": by_b["softmax"] / 1e9,
                             "attn_gemm_dram_GB": by_b["attention GEMMs"] / 1e9})
    return rows


def kernel_rows() -> list[Row]:
    """One dense layer of each model on each GPU: every kernel, per variant."""
    fig = load_figures("softmax")
    seq, batch, dtype = int(fig["seq_len"]), int(fig["batch"]), str(fig["dtype"].value)
    rows: list[Row] = []
    for gpu in fig["gpus"].value:
        model = GpuCost(device(gpu))
        for net in nets():
            for variant in VARIANTS:
                for group, name, t, dram in layer_kernels(model, net, False, variant, seq,
                                                          batch, dtype):
                    if group in ("attention GEMMs", "softmax", "flash"):
                        rows.append({"model": net.name, "gpu": gpu, "variant": variant,
                                     "kernel": name, "time_us": t * 1e6,
                                     "dram_MB": dram / 1e6})
    return rows


def seed_rows(rows: list[Row]) -> list[Row]:
    """The seed's figures beside ours (`required`: the study's acceptance)."""
    fig = load_figures("softmax")
    get = {(r["model"], r["gpu"], r["variant"]): r for r in rows}
    out: list[Row] = []

    def add(what: str, model: str, gpu: str, ours: float, theirs: float, kind: str,
            required: bool, source: str) -> None:
        diff = ours - theirs if kind == "share" else ours / theirs - 1
        tol = float(fig["acceptance_share_pp"] if kind == "share"
                    else fig["acceptance_speedup_rel"])
        out.append({"figure": what, "model": model, "gpu": gpu, "ours": round(ours, 4),
                    "seed": theirs, "diff": round(diff, 4), "kind": kind,
                    "required": required, "within": abs(diff) <= tol if required else None,
                    "source": source.split(":")[0]})

    for model, per_gpu in fig["sdf_speedup"].value.items():
        for gpu, v in per_gpu.items():
            add("SDF over baseline", model, gpu, get[(model, gpu, "sdf")]["speedup"], v,
                "speedup", True, fig["sdf_speedup"].source)
    a100 = "a100-pcie-40gb"
    for model, v in fig["softmax_share_a100"].value.items():
        add("softmax share of time", model, a100, get[(model, a100, "baseline")]
            ["softmax_share"], v, "share", True, fig["softmax_share_a100"].source)
    for model, v in fig["sd_speedup_a100"].value.items():
        add("SD over baseline", model, a100, get[(model, a100, "sd")]["speedup"], v,
            "speedup", False, fig["sd_speedup_a100"].source)
    for model, v in fig["sdf_over_sd_a100"].value.items():
        r = get[(model, a100, "sdf")]["speedup"] / get[(model, a100, "sd")]["speedup"]
        add("SDF over SD", model, a100, r, v, "speedup", False, fig["sdf_over_sd_a100"].source)
    b = get[("BERT-Large", a100, "baseline")]
    sda = (b["attention_ms"] + b["softmax_ms"]) / b["time_ms"]
    add("SDA block share of time", "BERT-Large", a100, sda, float(fig["sda_share_bert_a100"]),
        "share", False, fig["sda_share_bert_a100"].source)
    return out


def golden() -> list[Golden]:
    rows = variant_rows()
    return [Golden("variants.csv", rows), Golden("kernels.csv", kernel_rows()),
            Golden("seed.csv", seed_rows(rows))]


__all__: list[Any] = ["golden", "variant_rows", "seed_rows"]

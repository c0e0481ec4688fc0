"""The measured MoE rows of `moe_measured.toml` and the rules that emulate them (`moe.toml`):
each row's overrides, why a row cannot be expressed, the sources' FLOP counts and tokens/s,
what an emulation changes from what its source ran. `moe.py` plans and runs the rows."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from .common import Figure, load_figures
from .measured_rows import by_prefix, fp8_recipe_rule, last_wins
from .measured_rows import measured_tokens as tokens_per_gpu

MEASURED = Path(__file__).with_name("moe_measured.toml")
WORKLOAD = """name = "moe"

[run]
kind = "train"
iterations = 1
numerics = "off"
emulated_dtype = "{dtype}"

[device]
preset = "{device}"

[network]
preset = "{network}"

[model]
attention = "flash"

[moe]
tokens = "{tokens}"

[train]
memory_check = "warn"

[optimizer]
name = "adam"
"""


def fig(name: str) -> Figure:
    """One entry of moe.toml."""
    return load_figures("moe")[name]


def _data() -> dict[str, Any]:
    return tomllib.loads(MEASURED.read_text())


def measured() -> list[dict[str, Any]]:
    """The BF16 rows of moe_measured.toml, in file order."""
    dtype = str(fig("emulated_dtype").value)
    return [r for r in _data()["run"] if r["precision"] == dtype]


def fp8_rows() -> list[dict[str, Any]]:
    """The FP8 rows of moe_measured.toml, in file order."""
    return list(_data()["fp8_run"])


def fp8_recipe(row: dict[str, Any]) -> str:
    """An FP8 row's recipe (`moe.toml [fp8_recipes]`); "off" for a BF16 row."""
    if not str(row["precision"]).startswith("fp8"):
        return "off"
    return fp8_recipe_rule("moe", row)


def framework(row: dict[str, Any]) -> str:
    """The row's framework, short: its name before a parenthesis or a comma (Megatron-Bridge
    for the NeMo containers' Megatron-Bridge recipes)."""
    text = str(row["framework"])
    return "Megatron-Bridge" if "Megatron-Bridge" in text else re.split(r" \(|, ", text)[0]


def _by_prefix(table: str, row: dict[str, Any]) -> list[dict[str, Any]]:
    return by_prefix("moe", table, row)


def has_preset(model: str) -> bool:
    from ..model.presets import list_model_presets  # noqa: PLC0415
    return model in list_model_presets()


def not_modelled(model: str) -> dict[str, Any]:
    """The preset's `[not_modelled]` values (what the model has that mpiemu does not
    express); empty without a preset."""
    if not has_preset(model):
        return {}
    from ..model.presets import preset_path  # noqa: PLC0415
    raw = tomllib.loads(preset_path(model).read_text())
    return {k: e["value"] for k, e in raw.get("not_modelled", {}).items()}


def source_zero(row: dict[str, Any]) -> int:
    """The ZeRO stage of the row's own sharding (`moe.toml [sharding]`)."""
    for e in fig("sharding").value:
        if str(row["sharding"]).startswith(e["starts"]):
            return int(e["zero"])
    raise ValueError(f"{row['id']}: sharding {row['sharding']!r} has no rule in moe.toml")


def recompute_rule(row: dict[str, Any]) -> dict[str, Any]:
    """The `[recompute]` rule of the row's recomputation."""
    for e in fig("recompute").value:
        if str(row["recompute"]).startswith(e["starts"]):
            return dict(e)
    raise ValueError(f"{row['id']}: recompute {row['recompute']!r} has no rule in moe.toml")


def overrides(row: dict[str, Any]) -> list[str]:
    """`--set` items that emulate one measured row (every value from the row or its notes)."""
    tp, vp, ep = int(row["tp"]), int(row["vp"]), int(row["ep"])
    sp = str(fig("sequence_parallel").value) == "tp > 1" and tp > 1
    etp = int(row["etp"])
    zero = min(source_zero(row), int(fig("zero_with_experts").value)) \
        if ep > 1 or tp > 1 or etp > 1 else source_zero(row)
    sets = [f"model.preset='{row['model']}'", f"model.seq_len={row['seq_len']}",
            f"parallel.tp={tp}", f"parallel.pp={row['pp']}", f"parallel.cp={row['cp']}",
            f"parallel.dp={row['dp']}", f"parallel.ep={ep}",
            f"parallel.sequence_parallel={str(sp).lower()}",
            f"train.global_batch={row['global_batch']}", f"train.micro_batch={row['micro_batch']}",
            f"train.recompute='{recompute_rule(row)['recompute']}'", f"optimizer.zero={zero}",
            f"moe.capacity_factor={float(row['capacity_factor'])}"]
    if etp > 1:
        sets.append(f"parallel.etp={etp}")
    if vp > 1:
        sets += ["parallel.schedule='interleaved'", f"parallel.virtual_stages={vp}"]
    if fp8_recipe(row) != "off":
        sets.append(f"fp8.recipe='{fp8_recipe(row)}'")
    layers, pv = _layers(str(row["model"])), int(row["pp"]) * vp
    if layers % pv and (layers + 2) % pv == 0:
        sets += list(fig("uneven_split").value)
    for rule in fig("note_rules").value:
        if rule["phrase"] in str(row["notes"]):
            sets += list(rule["sets"])
    for rule in fig("overlap_rules").value:
        if rule["phrase"] in str(row["moe_overlap"]):
            sets += list(rule["sets"])
    for e in _by_prefix("layout_overrides", row):
        sets += list(e["sets"])
    return last_wins(sets)


def _layers(preset: str) -> int:
    if not has_preset(preset):
        return 1
    from ..model.presets import load_model_preset  # noqa: PLC0415
    return load_model_preset(preset).config.layers


def set_value(sets: list[str], key: str) -> str:
    return next(s for s in reversed(sets) if s.startswith(key + "=")).split("=", 1)[1]


def write_workload(where: Path) -> Path:
    """The study's base workload (device, network, dtype and token source from moe.toml)."""
    where.mkdir(parents=True, exist_ok=True)
    path = where / "moe.toml"
    path.write_text(WORKLOAD.format(dtype=fig("emulated_dtype").value,
                                    device=fig("device").value, network=fig("network").value,
                                    tokens=fig("tokens").value))
    return path


def not_expressed(row: dict[str, Any]) -> str:
    """Why the emulator cannot express the row's model or layout ("" when it can)."""
    why = []
    model = str(row["model"])
    if not has_preset(model):
        arch = next((e["architecture"] for e in fig("no_preset").value if e["model"] == model),
                    "not described")
        why.append(f"no preset (its architecture: {arch})")
    return "; ".join(why)


def kv_channels(cfg: Any, model: str) -> int:
    """The model's real head width: `model.kv_channels` where the preset sets it, else its
    `[not_modelled]` head_dim, else hidden / heads."""
    return int(getattr(cfg, "kv_channels", 0) or not_modelled(model).get("head_dim", 0)
               or cfg.hidden // cfg.heads)


def convention(row: dict[str, Any]) -> dict[str, Any] | None:
    found = _by_prefix("flop_conventions", row)
    return found[0] if found and has_preset(str(row["model"])) else None


def flops_per_token(row: dict[str, Any], workload: Path, convention: str) -> float:
    """Model FLOPs per token of the row's model in a source's count (`[flop_conventions]`):
    'ours' (`training.flops.model_flops`), 'megatron' (Megatron-LM's
    num_floating_point_operations with the causal halving, MLA where the model has it, MTP
    where the preset's `[not_modelled]` lists it) or 'automodel_qwen3' (AutoModel's
    qwen3_flops)."""
    from ..config.workload import load_workload  # noqa: PLC0415
    from ..runner.train_setup import resolve  # noqa: PLC0415
    from ..training.flops import model_flops  # noqa: PLC0415
    cfg, _, _ = resolve(load_workload(str(workload), overrides(row)))
    if convention == "ours":
        return model_flops(cfg, 1) / cfg.seq_len
    model = str(row["model"])
    L, h, s, n, g = cfg.layers, cfg.hidden, cfg.seq_len, cfg.heads, cfg.groups
    kv, m, nm = kv_channels(cfg, model), cfg.moe, not_modelled(model)
    assert m is not None, f"{row['id']}: {model} has no experts"
    if convention == "automodel_qwen3":
        ratio = n * kv / h
        return (6.0 * L * h * h * ratio * (2 * g / n + 1 + s / h + 1)
                + 18.0 * L * h * m.top_k * m.expert_ffn + 6.0 * h * cfg.vocab)
    if convention != "megatron":
        raise ValueError(f"flop convention {convention!r}")
    mtp = int(nm.get("mtp_depth", 0))
    layers = L + mtp
    moe_layers = L - m.dense_layers + mtp                     # the MTP block copies the last
    if cfg.mla:
        nope, rope, v = cfg.head_dim, cfg.qk_rope_dim, cfg.v_dim
        q_r, kv_r = cfg.q_lora_rank, cfg.kv_lora_rank
        attn = 6.0 * (q_r * (h + n * (nope + rope) + 1) + kv_r * (h + n * (nope + v) + 1)
                      + h * rope + n * v * h + s * n * (nope + rope) / 2 + s * n * v / 2)
    else:
        q = n * kv
        attn = 6.0 * (h * (q + 2 * kv * g) + q * s / 2 * 2 + q * h)
    mult = 3 if cfg.gated else 2
    mlp = 6.0 * h * mult * (cfg.ffn_hidden * m.dense_layers
                            + (m.expert_ffn * m.top_k + m.shared_ffn) * moe_layers)
    return (mlp + attn * layers + 6.0 * mtp * (3 * h + 2 * h * h)
            + 6.0 * h * cfg.padded_vocab * (mtp + 1))


def measured_tokens(row: dict[str, Any], workload: Path) -> float:
    """The row's tokens/s per GPU (`measured_rows.measured_tokens`, in this study's FLOP
    counts)."""
    return tokens_per_gpu(row, convention, lambda name: flops_per_token(row, workload, name))


def measured_mfu(row: dict[str, Any]) -> float | None:
    """The source's MFU: as printed, else its model TFLOP/s over the peak of its count."""
    other = row["other_metrics"]
    if "mfu" in other:
        return float(other["mfu"])
    conv = convention(row)
    tflops = row["value"] if row["metric"] == "model_tflops_per_gpu" else \
        other.get("model_tflops_per_gpu")
    return None if conv is None or tflops is None else float(tflops) / float(conv["peak_tflops"])


def routing_label(row: dict[str, Any]) -> str:
    """The source's routing, short."""
    text = str(row["routing"])
    if "forced balance" in text and "not forced" not in text:
        return "forced balance"
    if "token drop" in text:
        return "token drop (capacity 1.0, padded)"
    if "dropless" in text and "NOT STATED" not in text:
        return "dropless, aux loss"
    return "not stated (dropless)" if "dropless" in text else "not stated"


def emulated_with(row: dict[str, Any], sets: list[str]) -> list[str]:
    """What the emulation of this row changes from what its source ran."""
    from ..model.presets import load_model_preset  # noqa: PLC0415
    out = []
    zero = int(set_value(sets, "optimizer.zero"))
    if zero != source_zero(row):
        out.append(f"{row['sharding']} emulated with ZeRO-{zero} (moe.toml "
                   "[zero_with_experts])")
    note = recompute_rule(row)["note"]
    if note:
        out.append(note)
    if routing_label(row) != "forced balance":
        out.append(f"routing {row['routing']}: emulated in perfect balance")
    if "DeepEP" in str(row["dispatcher"]) or "HybridEP" in str(row["dispatcher"]):
        out.append(f"{row['dispatcher']} dispatch emulated as NCCL all-to-all(v)")
    overlap = str(row["moe_overlap"])
    modelled = any(r["phrase"] in overlap for r in fig("overlap_rules").value)
    if not overlap.startswith("none") and "NOT STATED" not in overlap and not modelled:
        out.append(f"not modelled: {overlap}")
    if "delay_wgrad_compute" in overlap:
        out.append("delay_wgrad_compute not modelled (weight gradients computed in place)")
    cfg, nm = load_model_preset(str(row["model"])).config, not_modelled(str(row["model"]))
    if "head_dim" in nm and cfg.head_dim != int(nm["head_dim"]):
        out.append(f"heads {cfg.head_dim} wide (hidden / heads) where the model's are "
                   f"{nm['head_dim']} (model.kv_channels not in the preset yet)")
    if "qk_norm" in nm:
        out.append("QK-norm not modelled")
    if int(nm.get("mtp_depth", 0)):
        out.append(f"its {nm['mtp_depth']} multi-token-prediction block not modelled (one "
                   "more MoE layer and output head per step)")
    return out

"""`mpiemu report moe`: published, measured BF16 pre-training of Mixture-of-Experts models on
H100 GPUs (`moe_measured.toml`) beside the same configurations emulated, timing only.

Each `[[run]]` row becomes one `mpiemu run` of its own layout, every parameter taken from the
row: model preset, TP, PP, CP, interleaved virtual stages, DP, EP, global batch, micro-batch,
sequence length, recomputation, the capacity factor, sequence parallelism (required with TP),
with what its notes add (`moe.toml [note_rules]`, `[layout_overrides]`). Tokens per expert are
in perfect balance (`moe.tokens = 'balanced'`, what forced-balance benchmarks run; each row
says what its source used). FSDP (ZeRO-3) over experts is not modelled: such rows run with
Megatron's distributed optimizer (ZeRO-1) and say so. A run of more GPUs than stages folds (`run.fold`) where that
is exact; a row is listed, not run, with its reason when its model has no preset, when it
uses expert tensor parallelism (etp > 1), when it is DeepSeek-V3 (`moe.toml [deepseek]`), when
the emulator refuses its layout, or when it needs more processes than `[max_processes]`.

* `rows.csv`: every BF16 row: measured and ours in the row's metric (step time, tokens/s per
  GPU or model TFLOP/s per GPU in its source's count), the difference ours / theirs - 1,
  tokens/s per GPU both ways, MFU (ours by `training.flops.model_flops`, and in the source's
  count where it states one), rank 0's breakdown, memory, what the emulation changes, or why
  the row was not emulated;
* `runs.csv`: each emulated run's MPI processes and wall seconds (not golden-checked).
Golden test: the Qwen3-30B-A3B row (8 GPUs, EP 8: one folded process).
"""
from __future__ import annotations

import dataclasses
import json
import re
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any, NamedTuple

from . import runs as launch
from .common import Figure, Golden, Row, load_figures

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
    """The FP8 rows of moe_measured.toml, in file order (listed, not emulated)."""
    return list(_data()["fp8_run"])


def framework(row: dict[str, Any]) -> str:
    """The row's framework, short: its name before a parenthesis or a comma (Megatron-Bridge
    for the NeMo containers' Megatron-Bridge recipes)."""
    text = str(row["framework"])
    return "Megatron-Bridge" if "Megatron-Bridge" in text else re.split(r" \(|, ", text)[0]


def _by_prefix(table: str, row: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in fig(table).value if row["id"].startswith(e["prefix"])]


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
    zero = min(source_zero(row), int(fig("zero_with_experts").value)) if ep > 1 or tp > 1 \
        else source_zero(row)
    sets = [f"model.preset='{row['model']}'", f"model.seq_len={row['seq_len']}",
            f"parallel.tp={tp}", f"parallel.pp={row['pp']}", f"parallel.cp={row['cp']}",
            f"parallel.dp={row['dp']}", f"parallel.ep={ep}",
            f"parallel.sequence_parallel={str(sp).lower()}",
            f"train.global_batch={row['global_batch']}", f"train.micro_batch={row['micro_batch']}",
            f"train.recompute='{recompute_rule(row)['recompute']}'", f"optimizer.zero={zero}",
            f"moe.capacity_factor={float(row['capacity_factor'])}"]
    if vp > 1:
        sets += ["parallel.schedule='interleaved'", f"parallel.virtual_stages={vp}"]
    layers, pv = _layers(str(row["model"])), int(row["pp"]) * vp
    if layers % pv and (layers + 2) % pv == 0:
        sets += list(fig("uneven_split").value)
    for rule in fig("note_rules").value:
        if rule["phrase"] in str(row["notes"]):
            sets += list(rule["sets"])
    for e in _by_prefix("layout_overrides", row):
        sets += list(e["sets"])
    return _last_wins(sets)


def _layers(preset: str) -> int:
    if not has_preset(preset):
        return 1
    from ..model.presets import load_model_preset  # noqa: PLC0415
    return load_model_preset(preset).config.layers


def _last_wins(sets: list[str]) -> list[str]:
    """One item per key, the last one given, in first-seen order."""
    last = {s.split("=")[0]: s for s in sets}
    return list(dict.fromkeys(last[s.split("=")[0]] for s in sets))


def _set_value(sets: list[str], key: str) -> str:
    return next(s for s in reversed(sets) if s.startswith(key + "=")).split("=", 1)[1]


def write_workload(where: Path) -> Path:
    """The study's base workload (device, network, dtype and token source from moe.toml)."""
    where.mkdir(parents=True, exist_ok=True)
    path = where / "moe.toml"
    path.write_text(WORKLOAD.format(dtype=fig("emulated_dtype").value,
                                    device=fig("device").value, network=fig("network").value,
                                    tokens=fig("tokens").value))
    return path


def mla_gap(model: str, seq_len: int) -> tuple[float, float, float, float]:
    """(the preset's attention, MLA's attention, the preset's MoE layer, MLA's MoE layer):
    forward GEMM FLOPs per token at `seq_len` in our count (`training.flops`, no causal
    halving), MLA's from the preset's `[not_modelled]` ranks and head widths."""
    from ..model.presets import load_model_preset  # noqa: PLC0415
    from ..training.flops import layer_forward_flops  # noqa: PLC0415
    cfg = dataclasses.replace(load_model_preset(model).config, seq_len=seq_len)
    nm, m = not_modelled(model), cfg.moe
    assert m is not None, f"{model}: no experts"
    h, n, s = cfg.hidden, cfg.heads, seq_len
    qk, v = int(nm["qk_nope_head_dim"]) + int(nm["qk_rope_head_dim"]), int(nm["v_head_dim"])
    q_r, kv_r, rope = int(nm["q_lora_rank"]), int(nm["kv_lora_rank"]), int(nm["qk_rope_head_dim"])
    mla = 2.0 * (q_r * h + q_r * n * qk + h * (kv_r + rope)
                 + kv_r * n * (int(nm["qk_nope_head_dim"]) + v) + n * v * h) \
        + 2.0 * s * n * qk + 2.0 * s * n * v
    layer = layer_forward_flops(cfg, 1, m.dense_layers)[0]
    mlp = 2.0 * (3 if cfg.gated else 2) * h * (m.top_k * m.expert_ffn + m.shared_ffn)
    return layer - mlp, mla, layer, mla + mlp


def deepseek_reason(model: str, seq_len: int) -> str:
    """Why a model with multi-head latent attention is not emulated (`moe.toml [deepseek]`)."""
    from ..model.presets import load_model_preset  # noqa: PLC0415
    cfg = load_model_preset(model).config
    nm = not_modelled(model)
    ours_attn, mla_attn, ours_layer, mla_layer = mla_gap(model, seq_len)
    mtp = int(nm.get("mtp_depth", 0))
    return (f"preset not honest for timing (moe.toml [deepseek]): it runs plain multi-head "
            f"attention, {cfg.heads} heads of {cfg.head_dim}, for DeepSeek-V3's multi-head "
            f"latent attention (q / kv ranks {nm['q_lora_rank']} / {nm['kv_lora_rank']}, "
            f"QK^T {int(nm['qk_nope_head_dim']) + int(nm['qk_rope_head_dim'])} and PV "
            f"{nm['v_head_dim']} wide per head): {ours_attn / mla_attn:.0%} of MLA's attention "
            f"FLOPs, an MoE layer {ours_layer / mla_layer - 1:+.1%} at sequence {seq_len}"
            + (f", and its {mtp} multi-token-prediction block is not modelled" if mtp else ""))


def not_expressed(row: dict[str, Any]) -> str:
    """Why the emulator cannot express the row's model or layout ("" when it can)."""
    why = []
    model = str(row["model"])
    if not has_preset(model):
        arch = next((e["architecture"] for e in fig("no_preset").value if e["model"] == model),
                    "not described")
        why.append(f"no preset (its architecture: {arch})")
    etp = int(fig("expert_tensor_parallel").value)
    if int(row["etp"]) > etp:
        why.append(f"expert tensor parallelism etp {row['etp']} is not modelled (experts run "
                   f"whole, etp {etp})")
    if not_modelled(model).get("attention_kind") == "mla" and fig("deepseek").value != "emulated":
        why.append(deepseek_reason(model, int(row["seq_len"])))
    return "; ".join(why)


class Plan(NamedTuple):
    """How one row is emulated: its overrides, MPI processes, or why it is not run."""

    row: dict[str, Any]
    sets: list[str]
    processes: int
    reason: str                      # "" when it is emulated


def plan(row: dict[str, Any], workload: Path) -> Plan:
    """The row's reason not to run first; else validate its layout as the run would, then
    fold it where that is exact."""
    sets = overrides(row)
    first = not_expressed(row)
    if first and not has_preset(str(row["model"])):
        return Plan(row, sets, 0, first)
    if not first:
        return _plan_layout(row, sets, workload)
    try:
        layout = _plan_layout(row, sets, workload)
    except Exception as exc:      # noqa: BLE001 - a row not run anyway: say how its check ends
        return Plan(row, sets, 0, f"{first}; validating its layout stops at "
                                  f"{type(exc).__name__}: {exc}")
    extra = f"; the emulator would also refuse the layout ({layout.reason})" \
        if layout.reason else ""
    return layout._replace(reason=first + extra)


def _plan_layout(row: dict[str, Any], sets: list[str], workload: Path) -> Plan:
    from ..config.errors import ConfigError  # noqa: PLC0415
    from ..config.workload import load_workload  # noqa: PLC0415
    from ..runner.fold_plan import plan_fold  # noqa: PLC0415
    from ..runner.train_setup import validate  # noqa: PLC0415
    gpus = int(row["gpus"])
    try:
        w = load_workload(str(workload), sets)
        validate(w, gpus)
    except ConfigError as exc:
        return Plan(row, sets, 0, f"the emulator refuses the layout: {exc}")
    procs, why = gpus, ""
    fold = w.parallel.cp * w.parallel.pp
    if fold < gpus:
        try:
            plan_fold(w, fold)
            procs = fold
        except ConfigError as exc:
            why = f"; it does not fold ({str(exc).split('; here ')[-1].split(': launch')[0]})"
    limit = int(fig("max_processes").value)
    if procs > limit:
        return Plan(row, sets, procs, f"{gpus} GPUs need {procs} MPI processes, more than "
                                      f"this study's {limit}{why}")
    return Plan(row, sets, procs, "")


def kv_channels(cfg: Any, model: str) -> int:
    """The model's real head width: `model.kv_channels` where the preset sets it, else its
    `[not_modelled]` head_dim, else hidden / heads."""
    return int(getattr(cfg, "kv_channels", 0) or not_modelled(model).get("head_dim", 0)
               or cfg.hidden // cfg.heads)


def _convention(row: dict[str, Any]) -> dict[str, Any] | None:
    found = _by_prefix("flop_conventions", row)
    return found[0] if found and has_preset(str(row["model"])) else None


def flops_per_token(row: dict[str, Any], workload: Path, convention: str) -> float:
    """Model FLOPs per token of the row's model in a source's count (`[flop_conventions]`):
    'ours' (`training.flops.model_flops`), 'megatron' (Megatron-LM's
    num_floating_point_operations with the causal halving, MLA and MTP where the preset's
    `[not_modelled]` lists them) or 'automodel_qwen3' (AutoModel's qwen3_flops)."""
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
    if nm.get("attention_kind") == "mla":
        nope, rope, v = (int(nm[k]) for k in ("qk_nope_head_dim", "qk_rope_head_dim",
                                              "v_head_dim"))
        q_r, kv_r = int(nm["q_lora_rank"]), int(nm["kv_lora_rank"])
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
    """The row's tokens/s per GPU: stated, from its step time, or from its model TFLOP/s in
    its source's count."""
    tokens = int(row["global_batch"]) * int(row["seq_len"]) / int(row["gpus"])
    metric, value = row["metric"], float(row["value"])
    if metric == "step_time_s":
        return tokens / value
    if metric == "tokens_per_s_per_gpu":
        return value
    if metric == "model_tflops_per_gpu":
        conv = _convention(row)
        assert conv is not None, f"{row['id']}: model TFLOP/s without a FLOP convention"
        return value * 1e12 / flops_per_token(row, workload, conv["name"])
    raise ValueError(f"{row['id']}: metric {metric!r}")


def measured_mfu(row: dict[str, Any]) -> float | None:
    """The source's MFU: as printed, else its model TFLOP/s over the peak of its count."""
    other = row["other_metrics"]
    if "mfu" in other:
        return float(other["mfu"])
    conv = _convention(row)
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
    zero = int(_set_value(sets, "optimizer.zero"))
    if zero != source_zero(row):
        out.append(f"{row['sharding']} emulated with ZeRO-{zero} (ZeRO-2 / 3 over experts is "
                   "not modelled)")
    note = recompute_rule(row)["note"]
    if note:
        out.append(note)
    if routing_label(row) != "forced balance":
        out.append(f"routing {row['routing']}: emulated in perfect balance")
    if "DeepEP" in str(row["dispatcher"]) or "HybridEP" in str(row["dispatcher"]):
        out.append(f"{row['dispatcher']} dispatch emulated as NCCL all-to-all(v)")
    overlap = str(row["moe_overlap"])
    if not overlap.startswith("none") and "NOT STATED" not in overlap:
        out.append(f"not modelled: {overlap}")
    cfg, nm = load_model_preset(str(row["model"])).config, not_modelled(str(row["model"]))
    if "head_dim" in nm and cfg.head_dim != int(nm["head_dim"]):
        out.append(f"heads {cfg.head_dim} wide (hidden / heads) where the model's are "
                   f"{nm['head_dim']} (model.kv_channels not in the preset yet)")
    if "qk_norm" in nm:
        out.append("QK-norm not modelled")
    return out


def row_of(p: Plan, workload: Path, summary: dict[str, Any] | None, shared: str) -> Row:
    """One CSV row: the measurement, ours beside it (None when not emulated)."""
    r = p.row
    gpus, tokens = int(r["gpus"]), int(r["global_batch"]) * int(r["seq_len"])
    theirs_tok = measured_tokens(r, workload)
    conv = _convention(r)
    out: Row = {"id": r["id"], "framework": framework(r), "model": r["model"], "gpus": gpus,
                "tp": r["tp"], "pp": r["pp"], "cp": r["cp"], "vp": r["vp"], "dp": r["dp"],
                "ep": r["ep"], "etp": r["etp"], "global_batch": r["global_batch"],
                "micro_batch": r["micro_batch"], "seq_len": r["seq_len"],
                "source_recompute": r["recompute"],
                "recompute": _set_value(p.sets, "train.recompute").strip("'"),
                "source_sharding": r["sharding"], "zero": int(_set_value(p.sets, "optimizer.zero")),
                "sequence_parallel": "parallel.sequence_parallel=true" in p.sets,
                "dispatcher": r["dispatcher"], "routing": routing_label(r),
                "tokens": fig("tokens").value, "metric": r["metric"], "measured": float(r["value"]),
                "ours": None, "difference": None, "measured_tokens_per_s_per_gpu": theirs_tok,
                "ours_tokens_per_s_per_gpu": None, "tokens_difference": None,
                "measured_step_s": tokens / (theirs_tok * gpus), "ours_step_s": None,
                "measured_mfu": measured_mfu(r), "ours_mfu": None, "ours_mfu_their_count": None,
                "ours_compute_s": None, "ours_tp_ep_exposed_s": None, "ours_dp_exposed_s": None,
                "ours_idle_s": None, "memory_GiB": None, "fits": None, "shared_run": shared,
                "emulated_with": "", "not_emulated": p.reason}
    if summary is None:
        return out
    it = summary["iterations"][0]
    step = float(it["t_end"] - it["t_start"])
    ours_tok = tokens / (step * gpus)
    if r["metric"] == "step_time_s":
        ours = step
    elif r["metric"] == "tokens_per_s_per_gpu":
        ours = ours_tok
    else:                                       # model TFLOP/s per GPU, in their count
        assert conv is not None, f"{r['id']}: model TFLOP/s without a FLOP convention"
        ours = ours_tok * flops_per_token(r, workload, conv["name"]) / 1e12
    idle = step - it["compute_s"] - it["tp_exposed_s"] - it["dp_exposed_s"]
    out.update({"ours": ours, "difference": ours / float(r["value"]) - 1.0,
                "ours_tokens_per_s_per_gpu": ours_tok,
                "tokens_difference": ours_tok / theirs_tok - 1.0, "ours_step_s": step,
                "ours_mfu": float(it["mfu"]), "ours_compute_s": float(it["compute_s"]),
                "ours_tp_ep_exposed_s": float(it["tp_exposed_s"]),
                "ours_dp_exposed_s": float(it["dp_exposed_s"]), "ours_idle_s": idle,
                "memory_GiB": summary["memory"]["total_bytes"] / 2**30,
                "fits": bool(summary["memory"]["fits"]),
                "emulated_with": "; ".join(emulated_with(r, p.sets))})
    if conv is not None:
        out["ours_mfu_their_count"] = (ours_tok * flops_per_token(r, workload, conv["name"])
                                       / (float(conv["peak_tflops"]) * 1e12))
    return out


def study_rows(runs: Path, ids: tuple[str, ...] = (), reuse: bool = False
               ) -> tuple[list[Row], list[Row]]:
    """(rows.csv, runs.csv) rows for every BF16 row (or those of `ids`): each distinct
    layout emulated once, in its folded form where that is exact."""
    workload = write_workload(runs)
    done: dict[tuple[str, ...], tuple[str, dict[str, Any]]] = {}
    planned: dict[tuple[str, ...], Plan] = {}
    rows: list[Row] = []
    log: list[Row] = []
    for r in measured():
        if ids and r["id"] not in ids:
            continue
        key = (str(r["gpus"]), str(r["model"]), str(r["etp"]), *overrides(r))
        if key not in planned:
            planned[key] = plan(r, workload)
        p = planned[key]._replace(row=r)
        if p.reason:
            rows.append(row_of(p, workload, None, ""))
            continue
        if key not in done:
            out = runs / r["id"]
            t0 = time.perf_counter()
            try:
                ran = _launch(p, workload, out, reuse)
            except RuntimeError as exc:
                planned[key] = _fold_failed(p, exc)
                if planned[key].reason:
                    rows.append(row_of(planned[key], workload, None, ""))
                    continue
                p = planned[key]
                ran = _launch(p, workload, out, reuse)
            log.append({"run": r["id"], "gpus": r["gpus"], "processes": p.processes,
                        "wall_s": time.perf_counter() - t0 if ran else None,
                        "sets": " ".join(p.sets)})
            done[key] = (r["id"], json.loads((out / "manifest.json").read_text())["summary"])
        first, summary = done[key]
        rows.append(row_of(p, workload, summary, first))
    return rows, log


def _fold_failed(p: Plan, exc: RuntimeError) -> Plan:
    """A folded run that folding stopped at its first inexact call (`FoldError`): unfolded
    if the study can afford one process per GPU, else not emulated, saying why."""
    found = re.search(r"FoldError: run\.fold: (.*?)(?:, so folding| \(traceback|$)", str(exc))
    if found is None or p.processes >= int(p.row["gpus"]):
        raise exc
    gpus, limit = int(p.row["gpus"]), int(fig("max_processes").value)
    if gpus <= limit:
        return p._replace(processes=gpus)
    return p._replace(reason=f"{gpus} GPUs need {gpus} MPI processes unfolded, more than this "
                             f"study's {limit}; folded, the run stops at its first inexact call "
                             f"({found.group(1)})")


def _launch(p: Plan, workload: Path, out: Path, reuse: bool) -> bool:
    """Run it (False: `reuse` and a complete run with the same overrides is already there)."""
    manifest = out / "manifest.json"
    if reuse and manifest.exists():
        m = json.loads(manifest.read_text())
        given = [c for i, c in enumerate(m.get("command", [])) if i and
                 m["command"][i - 1] == "--set"]
        if m.get("status") == "complete" and given == p.sets:
            return False
    launch.run(p.processes, workload, p.sets, out, timeout=1800)
    return True


def flop_checks(workload: Path) -> list[Row]:
    """Each source's FLOP count reproduced: rows that print model TFLOP/s beside a step time
    or tokens/s, their TFLOP/s recomputed from the latter with `[flop_conventions]`."""
    out: list[Row] = []
    for r in measured():
        conv = _convention(r)
        other = r["other_metrics"]
        printed = r["value"] if r["metric"] == "model_tflops_per_gpu" else \
            other.get("model_tflops_per_gpu")
        if conv is None or printed is None or r["metric"] == "model_tflops_per_gpu":
            continue
        tok = measured_tokens(r, workload)
        ours = tok * flops_per_token(r, workload, conv["name"]) / 1e12
        out.append({"id": r["id"], "convention": conv["name"], "printed_tflops": float(printed),
                    "from_their_throughput": ours, "difference": ours / float(printed) - 1.0})
    return out


def golden() -> list[Golden]:
    """The first emulated row: Qwen3-30B-A3B on 8 GPUs, EP 8 x DP 8 (one folded process)."""
    first = next(r["id"] for r in measured() if r["model"] == "qwen3-30b-a3b")
    with tempfile.TemporaryDirectory(prefix="mpiemu-moe-") as tmp:
        rows, _ = study_rows(Path(tmp), (first,))
    return [Golden("rows.csv", rows, lambda r: r["id"] == first)]

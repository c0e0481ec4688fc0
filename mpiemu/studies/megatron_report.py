"""`main` and Markdown of `mpiemu report megatron` (`megatron.py` runs it; every number
generated from the rows)."""
from __future__ import annotations

import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Callable, NamedTuple

from . import megatron
from ..workloads import DIR as WORKLOADS_DIR
from .common import (ROOT, Row, geomean, load_figures, md_table, out_dir_of, pct, read_csv,
                     runs_dir, signed_pct, study_args, study_parser, write_csv)
from .megatron import iteration_rows, layer_rows

if TYPE_CHECKING:
    from ..config.workload import Workload

SOURCES = Path(__file__).with_name("megatron_sources.toml")


def _cite(dataset: str) -> str:
    d = tomllib.loads(SOURCES.read_text())["datasets"][dataset]
    return f"[{d['title']} ({d['year']}), {d['where']}]({d['url']})"


def _ratio_line(rows: list[Row], what: str) -> str:
    if not rows:
        return f"No {what} were emulated."
    errs = [abs(r["difference"]) for r in rows]
    signed = sum(r["difference"] for r in rows) / len(rows)
    goal = float(load_figures("megatron")["goal"])
    within = sum(e <= goal for e in errs)
    return (f"{what.capitalize()}: geometric mean |difference| {pct(geomean(errs))}, mean "
            f"signed difference {signed_pct(signed)} (negative: ours faster); {within} of "
            f"{len(rows)} within the {pct(goal, 0)} goal.")


def markdown(layers: list[Row], its: list[Row]) -> list[str]:
    fig = load_figures("megatron")
    out = ["# Megatron-LM training: emulated vs published (DGX A100)", "",
           "Regenerate: `make reports` or `mpiemu report megatron` (runs of more GPUs than "
           "pipeline stages fold: one process per stage stands for its TP x DP GPUs, with "
           "bit-identical emulated times, docs/folding.md; the 280-GPU MT-NLG runs (35 "
           "processes) take about two minutes each on a 2-core machine, the 512-GPU 1T runs "
           "(64 processes, 512 micro-batches) two to three; `--skip-175b` leaves out every "
           "run of more than 8 GPUs, `--keep-runs DIR --reuse` rebuilds the tables from runs kept "
           "earlier). Device preset "
           f"`{fig['device'].value}`, network preset `dgx-a100`, timing only; nothing is "
           "fitted per configuration.", "",
           "## One GPT 22B layer, TP = 8 (forward + backward)", "",
           f"Measured: {_cite('korthikanti2022_table4_layer')}.", ""]
    out += md_table(["technique", "measured ms", "ours ms", "difference",
                     "forward theirs / ours ms", "difference", "backward theirs / ours ms",
                     "difference"],
                    [[r["run"].split(": ")[-1], f"{r['measured_ms']:.1f}",
                      f"{r['ours_ms']:.1f}", signed_pct(r["difference"]),
                      *_pass(r, "forward"), *_pass(r, "backward")] for r in layers],
                    "lrrrrrrr")
    out += ["", _ratio_line(layers, "layer times"), *_pass_line(layers), "",
            "## Whole iterations", "",
            f"Measured: {_cite('korthikanti2022_table5_present_work')} (selective + SP) and "
            "the full-recompute rows of the same table.", ""]
    out += md_table(["run", "GPUs", "measured s", "ours s", "difference", "MFU theirs",
                     "MFU ours", "HFU theirs", "HFU ours", "bubble (stage 0)",
                     "memory stage 0 GiB"],
                    [[r["run"], r["gpus"], f"{r['measured_s']:.2f}", f"{r['ours_s']:.2f}",
                      signed_pct(r["difference"]), _p(r["measured_mfu"]), pct(r["ours_mfu"]),
                      _p(r["measured_hfu"]), pct(r["ours_hfu"]),
                      pct(r["bubble_fraction_stage0"]), f"{r['memory_GiB_stage0']:.1f}"]
                     for r in its], "lrrrrrrrrrr")
    out += ["", _ratio_line(its, "iteration times"), ""]
    out += _relative(layers)
    out += _why(layers, its)
    out += ["## Not emulated", ""]
    out += md_table(["dataset", "model", "why"],
                    [[d["dataset"], d["model"], d["reason"]]
                     for d in fig["not_emulated"].value], "lll")
    out += ["", fig["not_emulated"].source + "."]
    return out


def _relative(layers: list[Row]) -> list[str]:
    """Each technique's time over the baseline layer's, theirs beside ours: the schedule's
    share of the result, apart from the compute model's absolute bias."""
    if not layers:
        return []
    base = layers[0]
    rows = [[r["run"].split(": ")[-1], f"{r['measured_ms'] / base['measured_ms']:.3f}",
             f"{r['ours_ms'] / base['ours_ms']:.3f}",
             signed_pct((r["ours_ms"] / base["ours_ms"]) /
                        (r["measured_ms"] / base["measured_ms"]) - 1.0)]
            for r in layers[1:]]
    return ["## Relative to the baseline layer", "",
            "What each technique costs or saves against the layer without it, theirs and "
            "ours: this is what the schedule (recomputation, SP's gathers, the asynchronous "
            "gradient reduction) decides, apart from how fast the GEMMs run.", "",
            *md_table(["technique", "theirs / baseline", "ours / baseline", "difference"],
                      rows, "lrrr"), ""]


def _mean_errors(name: str, keep: Callable[[dict[str, str]], bool],
                 is_bmm: Callable[[dict[str, str]], bool]) -> tuple[float, float, int] | None:
    """(mean error of the dense GEMMs, of the attention BMMs, rows) of the kept rows of
    results/kernels/<name>."""
    path = ROOT / "results" / "kernels" / name
    if not path.exists():
        return None
    rows = [r for r in read_csv(path) if keep(r)]
    gemm = [float(r["error"]) for r in rows if not is_bmm(r)]
    bmm = [float(r["error"]) for r in rows if is_bmm(r)]
    if not gemm or not bmm:
        return None
    return sum(gemm) / len(gemm), sum(bmm) / len(bmm), len(rows)


def _kernel_bias() -> tuple[float, float, int] | None:
    """How far the A100 GEMM model runs ahead of published A100 transformer GEMMs (the
    cookbook's judged layer GEMMs and attention BMMs; throughput errors)."""
    return _mean_errors("gemms.csv", lambda r: r["gpu"].startswith("a100") and r["set"] ==
                        "judge" and r["source"] == "cookbook_sample",
                        lambda r: "BMM" in r["used_by"])


def _here_bias() -> tuple[float, float, int] | None:
    """The same GEMM model on this project's own H100 (the four Megatron models' layer
    shapes at TP 8; time errors)."""
    return _mean_errors("measured_here_gemms.csv",
                        lambda r: r["group"] in ("22B", "175B", "530B", "1T"),
                        lambda r: r["bmm"] == "True")


class CommBias(NamedTuple):
    """Our all-reduce against nccl-tests at the 22B layer's TP message size."""

    msg_bytes: int
    dtype: str
    error: float          # mean busbw error of the neighbouring measured sizes
    points: int
    sizes: str


def _collective_bias() -> CommBias | None:
    """How far our 8-GPU A100 all-reduce runs ahead of nccl-tests at the sizes around the
    22B layer's TP all-reduce (results/collectives/comparison.csv, sizes within 2x)."""
    from ..devices.specs import dtype_bytes  # noqa: PLC0415
    from ..model.presets import load_model_preset  # noqa: PLC0415
    path = ROOT / "results" / "collectives" / "comparison.csv"
    if not path.exists():
        return None
    w = _layer_workload()
    m = load_model_preset(w.model.preset).config
    msg = w.train.micro_batch * m.seq_len * m.hidden * dtype_bytes(w.run.emulated_dtype)
    rows = [r for r in read_csv(path) if r["setup"] == "a100x8" and r["op"] == "all_reduce"
            and msg / 2 <= int(r["bytes"]) <= 2 * msg]
    if not rows:
        return None
    sizes = sorted({int(r["bytes"]) for r in rows})
    return CommBias(msg, w.run.emulated_dtype, sum(float(r["error"]) for r in rows) / len(rows),
                    len(rows), " and ".join(f"{b / 2**20:.0f} MiB" for b in sizes))


def _pass(r: Row, which: str) -> list[str]:
    """Theirs / ours and the difference of one pass (Table 4's forward or backward)."""
    theirs, ours = float(r[f"measured_{which}_ms"]), float(r[f"ours_{which}_ms"])
    return [f"{theirs:.1f} / {ours:.1f}", signed_pct(ours / theirs - 1.0)]


def _pass_line(layers: list[Row]) -> list[str]:
    """Where in the layer the difference sits: forward against backward."""
    if not layers:
        return []
    geo = {w: geomean([abs(float(r[f"ours_{w}_ms"]) / float(r[f"measured_{w}_ms"]) - 1.0)
                       for r in layers]) for w in ("forward", "backward")}
    return ["", f"By pass: geometric mean |difference| {pct(geo['forward'])} forward, "
            f"{pct(geo['backward'])} backward (recomputation included)."]


def _why(layers: list[Row], its: list[Row]) -> list[str]:
    rows = layers + its
    faster = sum(r["difference"] < 0 for r in rows)
    out = ["## Why the differences", "",
           f"{faster} of {len(rows)} emulated rows run faster than measured. The device model "
           "runs the transformer's GEMMs at the A100's sustained matmul rate (`gemm.efficiency`, "
           "fitted on two large cuBLASLt GEMMs measured on Azure's A100-SXM4-80GB, "
           "results/kernels/) and its non-GEMM kernels at that GPU's measured HBM copy rate."]
    bias = _kernel_bias()
    if bias is not None:
        out[-1] += (f" Against published A100 transformer GEMMs (results/kernels/, {bias[2]} "
                    f"rows of EleutherAI's cookbook, kept apart from any fit) the same model's "
                    f"throughput is {signed_pct(bias[0])} on the layer GEMMs and "
                    f"{signed_pct(bias[1])} on the attention BMMs, on average: part of the gap "
                    "is the A100 GEMM model's, above all on the attention BMMs.")
    here = _here_bias()
    if here is not None:
        out[-1] += (f" The same model, timed against these models' own layer shapes on this "
                    f"project's H100 (results/kernels/, 'Measured here', {here[2]} GEMMs), "
                    f"errs by {signed_pct(here[0])} in time on the dense GEMMs and "
                    f"{signed_pct(here[1])} on the attention BMMs (negative: ours faster), "
                    "whose short K or N leaves them streaming their scores through DRAM at "
                    "the device's streaming rate.")
    comm = _collective_bias()
    if comm is not None:
        how = "faster" if comm.error > 0 else "slower"
        out[-1] += (f" The layer's TP all-reduce of its activations ({comm.msg_bytes / 2**20:.0f} "
                    f"MiB, micro-batch x sequence x hidden in {comm.dtype}) runs {how} than "
                    "measured: against nccl-tests on 8-GPU A100 nodes at the neighbouring sizes "
                    f"(results/collectives/, {comm.points} points from {comm.sizes}), our "
                    f"all-reduce's bus bandwidth is {signed_pct(comm.error)} on average.")
    out[-1] += " " + _overlap_note()
    return out + ["", *_hooks_note(layers), *_step_note(its),
                  "Nothing here is fitted to close the gap: it is left visible.", ""]


def _hooks_note(layers: list[Row]) -> list[str]:
    """What Megatron-LM's gradient-buffer hooks cost the 22B layer's backward (a paragraph,
    or nothing when the rows charge none)."""
    base = next((r for r in layers if r.get("ours_grad_acc_ms")), None)
    if base is None:
        return []
    return [f"Every backward also adds each parameter's gradient into Megatron-LM's "
            f"{_layer_workload().run.emulated_dtype} `main_grad` buffer with a kernel of its "
            "own (the DDP hook; gradient accumulation fusion needed fp32 accumulation then, "
            f"`training/grad_buffer.py`): {base['ours_grad_acc_ms']:.2f} ms of the 22B layer's "
            f"{base['ours_backward_ms']:.1f} ms backward, once per micro-batch, in every row "
            "above.", ""]


def _step_note(iterations: list[Row]) -> list[str]:
    """What Megatron-LM's step charges outside the layers, in the run furthest from its
    measurement among those whose rank 0 charges both (a single-stage run)."""
    both = [r for r in iterations
            if r.get("ours_grad_scale_ms_rank0") and r.get("ours_ce_ms_rank0")]
    if not both:
        return []
    row = max(both, key=lambda r: abs(r["difference"]))
    return [f"Outside the layers, the {row['run']} iteration ({row['ours_s']:.3f} s) also "
            "runs Megatron-LM's vocab-parallel cross-entropy as PyTorch ops over the logits "
            f"cast to fp32 ({row['ours_ce_ms_rank0']:.1f} ms, `devices.kernels.cross_entropy`) "
            "and, with the local DDP of the time, divides the whole gradient buffer by the DP "
            f"size, even at DP 1 ({row['ours_grad_scale_ms_rank0']:.1f} ms, `train.ddp`).",
            ""]


def _layer_workload() -> Workload:
    """The 22B layer rows' workload (its dtype and micro-batch)."""
    from ..config.workload import load_workload  # noqa: PLC0415
    return load_workload(WORKLOADS_DIR / "megatron-22b-tp8.toml")


def _overlap_note() -> str:
    """What the backward's overlapped all-reduces cost the GEMMs under them."""
    from ..devices.presets import load_device  # noqa: PLC0415
    from ..net import load_network  # noqa: PLC0415
    spec = load_device(str(load_figures("megatron")["device"].value))
    net = load_network(spec.network)
    return ("The backward pass, where Megatron-LM runs each input-gradient all-reduce (or "
            "reduce-scatter) under the weight-gradient GEMM, pays for that overlap: NCCL's "
            f"kernel holds {net.channels} of the {spec.compute_units} SMs meanwhile (one per "
            "channel, `sim/sms.py`), so the GEMM runs on the rest; no contention for DRAM "
            "between them is modelled.")


def _p(x: float | None) -> str:
    return pct(x) if x is not None else "-"


def main(out_dir: Path, argv: list[str]) -> int:
    ap = study_parser("megatron", megatron.__doc__)
    ap.add_argument("--reuse", action="store_true",
                    help="with --keep-runs: take complete runs already there instead of "
                         "running them again (they must come from this code and config)")
    ap.add_argument("--skip-175b", action="store_true",
                    help="leave out the runs of more than 8 GPUs (175B, 530B: the slow part)")
    args = study_args(ap, argv)
    out_dir = out_dir_of(args, out_dir)
    fig = load_figures("megatron")
    labels = tuple(c["label"] for c in fig["iteration_runs"].value
                   if not (args.skip_175b and c["ranks"] > 8))
    with runs_dir(args, "mpiemu-megatron-") as runs:
        lay, its = layer_rows(runs, reuse=args.reuse), iteration_rows(runs, labels, args.reuse)
    write_csv(out_dir / "layers.csv", lay)
    write_csv(out_dir / "iterations.csv", its)
    (out_dir / "README.md").write_text("\n".join(markdown(lay, its)) + "\n")
    print(f"wrote {out_dir}/README.md and CSV beside it")
    return 0

"""Every study the project reproduces: two modules each, its paper numbers in a sourced data file.

A study `<name>` has
* `mpiemu/studies/<name>.py`, the numbers: its sweeps, rows and constants, and
  `golden() -> list[Golden]`, the CSV rows regenerated from the models for the golden test
  (`tests/test_studies_golden.py`), all of them or a stated cheap subset;
* `mpiemu/studies/<name>_report.py`, the report: `main(out_dir: Path, argv: list[str]) -> int`,
  which regenerates `results/<name>/` (README, CSV, PNG), with its Markdown and plots; it
  imports `<name>.py`, never the other way round (tests/test_layering.py: no import circle);
and its paper's figures in `mpiemu/studies/<name>.toml` (`common.load_figures`).
Adding a study: those modules, that data file, one `StudyInfo` line below (docs/studies.md).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType


@dataclass(frozen=True)
class StudyInfo:
    """One registry line: the study's name, module, seeds and what it reproduces."""

    name: str
    module: str
    seeds: str
    what: str


STUDIES: dict[str, StudyInfo] = {s.name: s for s in (
    StudyInfo("t3", "mpiemu.studies.t3", "003 (thesis ch. 8.5)",
              "T3 fused GEMM + ring reduce-scatter on the thesis's 16 sub-layers"),
    StudyInfo("sunway", "mpiemu.studies.sunway", "001 (SWattention), 000 (SwFormer)",
              "SWattention vs standard attention, SwFormer OPT2 / KA scheduling"),
    StudyInfo("kernels", "mpiemu.studies.kernels", "published GEMM measurements (kernels.toml)",
              "GEMM throughput of transformer-layer shapes on A100 and H100"),
    StudyInfo("softmax", "mpiemu.studies.softmax", "004 (softmax recomposition)",
              "baseline / SD / SDF / flash attention on A100, RTX 3090, T4"),
    StudyInfo("fusion", "mpiemu.studies.fusion", "002 (StarPU / NNTile report)",
              "fused GEMM epilogues and StarPU task granularity on 1-8 GPUs"),
    StudyInfo("comp_vs_comm", "mpiemu.studies.comp_vs_comm", "003 (thesis ch. 5)",
              "serialized TP and overlapped DP communication vs compute, H / SL / B / TP and "
              "compute 1-4x"),
    StudyInfo("bert_characterization", "mpiemu.studies.bert_characterization",
              "003 (thesis ch. 4)", "BERT-Large per-op breakdown on MI100, TP / DP "
              "communication shares"),
    StudyInfo("collectives", "mpiemu.studies.collectives", "published nccl-tests, NCCL's model",
              "all-reduce / all-gather / reduce-scatter busbw on DGX A100 / H100, 1-16 nodes"),
    StudyInfo("megatron", "mpiemu.studies.megatron", "Megatron-LM papers (megatron_sources.toml)",
              "GPT 22B / 175B training on DGX A100: layer and iteration times, MFU"),
    StudyInfo("llama", "mpiemu.studies.llama", "llama_measured.toml (published H100 runs)",
              "Llama 2 / 3 / 3.1 8B-405B BF16 pre-training on H100: step time, tokens/s/GPU, "
              "MFU"),
    StudyInfo("moe", "mpiemu.studies.moe", "moe_measured.toml (published H100 MoE runs)",
              "Mixtral / Qwen3 / DeepSeek-V3 and other MoE BF16 pre-training on H100: step "
              "time, tokens/s/GPU, MFU"),
    StudyInfo("nmc_optimizer", "mpiemu.studies.nmc_optimizer", "003 (thesis ch. 6)",
              "LAMB / Adam updates on near-bank compute vs the GPU, BERT end to end"),
    StudyInfo("precision", "mpiemu.studies.precision", "none (real numerics in each format)",
              "small GPT and Llama trained in fp64 / fp32 / bf16 / fp16: losses; a published "
              "Llama 3.1 8B layout's step time in BF16 and each FP8 recipe"),
    StudyInfo("moe_imbalance", "mpiemu.studies.moe_imbalance",
              "none (the router's own choices over real training steps)",
              "expert load imbalance over hundreds of training steps (aux loss on / off, "
              "expert bias) and its emulated step-time cost, small model and Mixtral 8x7B "
              "shapes"),
)}


def _info(name: str) -> StudyInfo:
    """The registry line of a study; one line naming the choices otherwise."""
    if name not in STUDIES:
        raise ValueError(f"report={name!r}; choose one of {sorted(STUDIES)} "
                         "(mpiemu report --list)")
    return STUDIES[name]


def study_module(name: str) -> ModuleType:
    """The numbers module of a registered study (`golden()`)."""
    return importlib.import_module(_info(name).module)


def report_module(name: str) -> ModuleType:
    """The report module of a registered study (`main`): its numbers module + `_report`."""
    return importlib.import_module(_info(name).module + "_report")


def run_study(name: str, out: Path | None, argv: list[str]) -> int:
    """Regenerate one study into `out` (default results/<name>) with its report's `main`."""
    return int(report_module(name).main(out or Path("results") / name, argv))


def list_lines() -> list[str]:
    """`mpiemu report --list`: name, seeds and what each study reproduces."""
    width = max(len(n) for n in STUDIES)
    return [f"{s.name:<{width}}  seeds {s.seeds}: {s.what}" for s in STUDIES.values()]

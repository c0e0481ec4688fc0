"""`mpiemu report moe_imbalance`: expert load imbalance over real training steps, and what it
costs in emulated step time, a study no timing-only simulator can run (the router's choices
come from the model's own numerics, step after step).

For each run of `moe_imbalance.toml` (`runs`: the Switch auxiliary loss, none, DeepSeek-V3's
expert bias; one seed) five emulated jobs (`studies/runs.py`, `mpiemu run` as a user runs it,
every setting given with `--set` over `workloads/quickstart.toml`, so that file's values do
not matter):
1. the small MoE model (`small_model`) trained with numerics on, EP 4 x DP 4 on H100s: loss,
   `routing.npz` (`counts[step, layer, rank, expert]`, each token's `choices`) and the
   emulated step times;
2. the same configuration timing only, replaying 1's recorded choices (`moe.tokens =
   'trace'`): its step times must equal 1's, step for step (determinism; for the runs of
   `replay_check`, every run with `--replay-all`);
3. the same configuration timing only under forced balance (`moe.tokens = 'balanced'`,
   folded onto one process where exact): the balanced step time of each step;
4. Mixtral 8x7B's layer shapes (`large_model`), timing only, replaying 1's choices: layer l
   step i replays the recorded layer l step i; each rank's 4,096 tokens wrap over the
   recorded step's 1,024 (token t reads recorded token t mod 1,024), so every rank sends the
   recorded step's whole mix four times and every expert receives 16x its recorded tokens
   (checked on 4's own `routing.npz`);
5. 4's configuration under forced balance.
A step's time is the slowest rank's iteration (`analysis.run_breakdown`, the "slowest rank"
column of `mpiemu analyze`). Per step (`steps.csv`): expert load max / mean over experts and
the busiest EP rank's received tokens over the mean (each the worst of the layers;
`layers.csv` has every layer), step time, balanced step time, slowdown = step / balanced,
small and large. Golden test: the first `golden.steps` steps of `golden.run` (five short jobs).
"""
from __future__ import annotations

import json
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from . import runs as launch
from ..workloads import DIR as WORKLOADS_DIR
from .common import Golden, Row, load_figures

STUDY = "moe_imbalance"
WORKLOAD = WORKLOADS_DIR / "quickstart.toml"
GPUS = 4


def figures() -> dict[str, Any]:
    """The study's setup values (`moe_imbalance.toml`)."""
    return {k: f.value for k, f in load_figures(STUDY).items()}


def _lit(v: Any) -> str:
    """A `--set` value as TOML."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f"'{v}'"
    return repr(v)


def base_sets(large: bool) -> list[str]:
    """Every setting of a run of the small (or the large) model, numerics on, router tokens."""
    f = figures()
    lay, opt, dt = f["layout"], f["optimizer"], f["dtypes"]
    sets = {"run.kind": "train", "run.seed": int(f["seed"]), "run.numerics": "on",
            "run.numeric_dtype": dt["numeric"], "run.emulated_dtype": dt["emulated"],
            "device.preset": f["device"], "parallel.tp": lay["tp"], "parallel.pp": lay["pp"],
            "parallel.dp": lay["dp"], "parallel.ep": lay["ep"],
            "parallel.sequence_parallel": False, "train.check_reference": False,
            "train.dp_bucket_MiB": opt["dp_bucket_MiB"], "optimizer.name": opt["name"],
            "optimizer.lr": opt["lr"], "optimizer.zero": opt["zero"]}
    if large:
        m = f["large_model"]
        sets |= {"model.preset": m["preset"], "model.layers": m["layers"],
                 "train.global_batch": m["global_batch"], "train.micro_batch": m["micro_batch"]}
    else:
        sets |= {f"{sec}.{k}": v for sec in ("model", "moe")
                 for k, v in f["small_model"][sec].items()}
        sets |= {f"train.{k}": v for k, v in f["batch"].items()}
    return [f"{k}={_lit(v)}" for k, v in sets.items()]


def job_sets(run: dict[str, Any], large: bool, tokens: str, steps: int,
             trace: Path | None = None) -> list[str]:
    """A job's `--set`s: the model, the run's balancing, where tokens come from, steps."""
    sets = base_sets(large) + list(run["sets"]) + [f"run.iterations={steps}"]
    if tokens != "router":
        sets += ["run.numerics='off'", f"moe.tokens='{tokens}'"]
    if trace is not None:
        sets.append(f"moe.trace='{trace}'")
    return sets


@dataclass
class Job:
    """One emulated job: which run and model, where its tokens came from, what it cost."""

    run: str
    model: str                  # "small" or "large"
    tokens: str                 # "router", "trace" or "balanced"
    processes: int
    steps: int
    wall_s: float
    path: Path


def start(run: dict[str, Any], large: bool, tokens: str, steps: int, out: Path,
          trace: Path | None = None) -> Job:
    """Launch one job (folded onto fewer processes where exact) and time it."""
    sets = job_sets(run, large, tokens, steps, trace)
    n = launch.processes(WORKLOAD, sets, GPUS)
    t0 = time.perf_counter()
    launch.run(n, WORKLOAD, sets, out)
    return Job(run["label"], "large" if large else "small", tokens, n, steps,
               time.perf_counter() - t0, out)


def step_seconds(run_dir: Path) -> np.ndarray:
    """[steps]: the slowest rank's iteration time of each step (emulated seconds)."""
    from ..analysis import load, run_breakdown  # noqa: PLC0415
    per_rank = run_breakdown(load(run_dir))
    return np.array([[b.iteration_s for b in r] for r in per_rank]).max(0)


def losses(run_dir: Path) -> list[float]:
    """Each step's loss as the run reported it (`manifest.json`)."""
    its = json.loads((run_dir / "manifest.json").read_text())["summary"]["iterations"]
    return [float(r["loss"]) for r in its]


def routed(run_dir: Path) -> np.ndarray:
    """`counts[step, layer, rank, expert]` of the run's `routing.npz`."""
    with np.load(run_dir / "routing.npz") as f:
        return np.asarray(f["counts"])


def imbalance(counts: np.ndarray, ep: int) -> tuple[np.ndarray, np.ndarray]:
    """[steps, layers] expert load max / mean over experts, and the busiest EP rank's
    received tokens over the mean over EP ranks (experts split contiguously over EP)."""
    per_expert = counts.sum(2).astype(np.float64)                       # [I, L, E]
    per_rank = per_expert.reshape(*per_expert.shape[:2], ep, -1).sum(-1)  # [I, L, ep]
    return (per_expert.max(-1) / per_expert.mean(-1), per_rank.max(-1) / per_rank.mean(-1))


@dataclass
class Results:
    """What `study` measured: the CSVs' rows, every job, and the checks."""

    steps: list[Row] = field(default_factory=list)
    layers: list[Row] = field(default_factory=list)
    jobs: list[Job] = field(default_factory=list)
    # run -> largest |replayed - recorded| step time (s), or None when not checked
    replay_diff_s: dict[str, float | None] = field(default_factory=dict)
    # run -> whether the large replay's experts received a fixed multiple of the recorded loads
    large_matches: dict[str, bool] = field(default_factory=dict)
    # run -> that multiple
    large_factor: dict[str, float] = field(default_factory=dict)
    workers: int = 1            # jobs run at a time


def study(runs_dir: Path, steps: int | None = None, labels: Sequence[str] = (),
          replay: Sequence[str] | None = None, workers: int = 2) -> Results:
    """Every job of every run (or of `labels`), `steps` steps each (the toml's by default),
    the numerics runs of `replay` (the toml's `replay_check` by default) replayed on their
    own configuration, `workers` jobs at a time (each run's timing-only jobs start when its
    numerics run ends; emulated times do not depend on it)."""
    f = figures()
    steps = steps or int(f["steps"])
    replay = list(f["replay_check"]) if replay is None else list(replay)
    ep = int(f["layout"]["ep"])
    chosen = [r for r in f["runs"] if not labels or r["label"] in labels]
    res = Results(workers=max(1, workers))
    with ThreadPoolExecutor(max(1, workers)) as pool:
        numerics = [pool.submit(start, run, False, "router", steps,
                                runs_dir / run["label"] / "numerics") for run in chosen]
        timing = []
        for run, fut in zip(chosen, numerics):
            trace = fut.result().path / "routing.npz"
            base = runs_dir / run["label"]
            timing.append([pool.submit(start, run, large, tokens, steps, base / name,
                                       trace if tokens == "trace" else None)
                           for large, tokens, name in
                           ((False, "trace", "replay"), (False, "balanced", "balanced"),
                            (True, "trace", "large"), (True, "balanced", "large-balanced"))
                           if run["label"] in replay or name != "replay"])
        done = [(fut.result(), [t.result() for t in ts]) for fut, ts in zip(numerics, timing)]
    for num, rest in done:
        res.jobs += [num, *rest]
        by = {(j.model, j.tokens): j for j in rest}
        label = num.run
        t = step_seconds(num.path)
        res.replay_diff_s[label] = float(np.abs(step_seconds(
            by["small", "trace"].path) - t).max()) if ("small", "trace") in by else None
        t_bal, t_big, t_big_bal = (step_seconds(by[k].path) for k in
                                   (("small", "balanced"), ("large", "trace"),
                                    ("large", "balanced")))
        counts, big_counts = routed(num.path), routed(by["large", "trace"].path)
        load, busy = imbalance(counts, ep)
        small_e, big_e = counts.sum(2), big_counts.sum(2)
        factor = float(big_e.sum() / small_e.sum())
        res.large_factor[label] = factor
        res.large_matches[label] = bool(np.array_equal(big_e, small_e * round(factor)))
        loss = losses(num.path)
        for i in range(steps):
            res.steps.append({
                "step": i, "run": label, "loss": loss[i],
                "expert_load_max_over_mean": float(load[i].max()),
                "busiest_ep_rank_over_mean": float(busy[i].max()),
                "step_ms": float(t[i]) * 1e3, "balanced_ms": float(t_bal[i]) * 1e3,
                "slowdown": float(t[i] / t_bal[i]),
                "large_step_ms": float(t_big[i]) * 1e3,
                "large_balanced_ms": float(t_big_bal[i]) * 1e3,
                "large_slowdown": float(t_big[i] / t_big_bal[i])})
            for layer in range(load.shape[1]):
                res.layers.append({
                    "step": i, "run": label, "layer": layer,
                    "expert_load_max_over_mean": float(load[i, layer]),
                    "busiest_ep_rank_over_mean": float(busy[i, layer]),
                    "hottest_expert": int(small_e[i, layer].argmax())})
    return res


def job_rows(res: Results) -> list[Row]:
    """`runs.csv`: every job, its processes and wall time, and its check."""
    out: list[Row] = []
    for j in res.jobs:
        check = ""
        if j.model == "small" and j.tokens == "trace":
            check = (f"largest difference from the numerics run's step: "
                     f"{res.replay_diff_s[j.run]:.3g} s")
        elif j.model == "large" and j.tokens == "trace":
            check = (f"every expert received {res.large_factor[j.run]:g}x its recorded tokens: "
                     f"{str(res.large_matches[j.run]).lower()}")
        out.append({"run": j.run, "model": j.model, "tokens": j.tokens,
                    "processes": j.processes, "steps": j.steps, "wall_s": j.wall_s,
                    "check": check})
    return out


def golden() -> list[Golden]:
    """The first `golden.steps` steps of `golden.run` in `steps.csv` (five short jobs)."""
    g = figures()["golden"]
    n, label = int(g["steps"]), str(g["run"])
    with tempfile.TemporaryDirectory(prefix="mpiemu-moe-imb-") as tmp:
        res = study(Path(tmp), n, (label,), replay=())
    return [Golden("steps.csv", res.steps,
                   lambda r: r["run"] == label and int(r["step"]) < n)]

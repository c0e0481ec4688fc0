"""`main`, README and plot of `mpiemu report moe_imbalance` (`moe_imbalance.py` runs the jobs
and computes the rows): every number in the prose comes from the rows, the study's data file,
a model preset or a trace (none typed here)."""
from __future__ import annotations

import math
import os
import time
from itertools import combinations
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..model.seeded import NOISE_FRACTION
from . import moe_imbalance
from .common import (Row, load_figures, md_table, out_dir_of, pct, plt, runs_dir, signed_pct,
                     study_args, study_parser, write_csv)
from .moe_imbalance import WORKLOAD, Results, base_sets, figures, job_rows, study

PNG = "imbalance.png"
HOT = 2.0           # the load (x the mean) whose first step the findings name


def _cfg(large: bool) -> Any:
    """The resolved model of the small (or large) runs."""
    from ..config.workload import load_workload  # noqa: PLC0415
    w = load_workload(str(WORKLOAD), base_sets(large))
    return w.moe.apply(w.model.resolve())


def _of(rows: Sequence[Row], run: str, key: str) -> np.ndarray:
    return np.array([float(r[key]) for r in rows if r["run"] == run])


def _labels() -> list[str]:
    return [r["label"] for r in figures()["runs"]]


def _rng(x: np.ndarray, digits: int = 2) -> str:
    return f"{x.min():.{digits}f}-{x.max():.{digits}f}"


def _first(x: np.ndarray, at_least: float) -> str:
    hit = np.flatnonzero(x >= at_least)
    return f"step {hit[0]}" if len(hit) else "never"


def expert_share(run_dir: Path) -> float:
    """Share of a balanced step (iteration 0, rank 0) that its experts' compute takes (ops
    named `lN.experts.*`: the GEMMs and SwiGLU whose size follows the tokens received)."""
    from ..analysis import load, run_breakdown  # noqa: PLC0415
    run = load(run_dir)
    rt = run.ranks[0]
    ev = rt.events
    sel = (ev["iteration"] == 0) & rt.is_cat("compute") & \
        np.array([".experts." in str(n) for n in rt.names])
    step = run_breakdown(run)[0][0].iteration_s
    return float((ev["t_end"][sel] - ev["t_start"][sel]).sum() / step)


def predicted(layers: Sequence[Row], run: str, share: float) -> np.ndarray:
    """[steps]: 1 + share x (mean over layers of the busiest EP rank's load - 1): every rank
    waits at each layer's all-to-all for the rank holding the most tokens."""
    mine = [r for r in layers if r["run"] == run]
    n_layers = 1 + max(int(r["layer"]) for r in mine)
    busy = np.array([float(r["busiest_ep_rank_over_mean"]) for r in mine]).reshape(-1, n_layers)
    return 1 + share * (busy.mean(1) - 1)


def _setup(res: Results, small: Any, large: Any) -> list[str]:
    f = figures()
    lay, b, lm, dt = f["layout"], f["batch"], f["large_model"], f["dtypes"]
    assert small.moe is not None and large.moe is not None
    m = small.moe
    tokens = b["global_batch"] * small.seq_len
    runs = md_table(["run", "what", "overrides"], align="lll", rows=
                    [[r["label"], r["what"], ", ".join(f"`{s}`" for s in r["sets"]) or "-"]
                     for r in f["runs"]])
    return [
        "## What was run", "",
        f"**Small model, trained for real.** `{small.name}` with overrides "
        f"(`moe_imbalance.toml`): {small.layers} layers, hidden {small.hidden}, "
        f"{small.heads} heads ({small.kv_heads or small.heads} KV), {m.experts} SwiGLU experts "
        f"of width {m.expert_ffn}, top-{m.top_k} {m.score} routing"
        f"{' (softmax over all experts, then top-k)' if m.pre_softmax else ''}, "
        f"{'dropless' if m.capacity_factor == 0 else f'capacity factor {m.capacity_factor}'}, "
        f"z-loss {m.z_loss_coeff:g}, vocabulary {small.vocab}, sequences of {small.seq_len}; "
        f"{small.param_count() / 1e6:.3g}M parameters. {res.jobs[0].steps} steps of "
        f"{b['global_batch']} sequences ({tokens} tokens, {b['micro_batch']} sequences per "
        f"rank in one micro-batch), Adam at a constant {f['optimizer']['lr']:g}, seed "
        f"{f['seed']}, numerics in {dt['numeric']} (the router decides on the real logits), "
        f"time and bytes charged in {dt['emulated']} on `{f['device']}` ranks: TP "
        f"{lay['tp']} x PP {lay['pp']} x DP {lay['dp']}, EP {lay['ep']} "
        f"({m.experts // lay['ep']} experts per rank). The data are the project's seeded "
        f"synthetic sequences (a token recurrence with {pct(NOISE_FRACTION, 0)} random "
        "tokens, `model/seeded.py`), the same in every run.", "",
        *runs, "",
        f"**Large model, timing only.** `{large.name}`'s layer shapes, {lm['layers']} of its "
        f"layers: hidden {large.hidden}, {large.heads} heads ({large.kv_heads} KV), "
        f"{large.moe.experts} experts of width {large.moe.expert_ffn}, top-{large.moe.top_k}, "
        f"sequences of {large.seq_len}, {lm['global_batch']} sequences per step "
        f"({lm['micro_batch']} per rank), the same layout and device; "
        f"{large.param_count() / 1e9:.3g}B parameters. It replays each small run's recorded "
        "choices (`moe.tokens='trace'`): step i layer l replays the recorded step i layer l, "
        f"and rank r's {lm['micro_batch'] * large.seq_len} tokens read the recorded tokens t "
        f"mod {tokens}, so every rank sends the recorded step's whole mix "
        f"{lm['micro_batch'] * large.seq_len // tokens} times and each expert receives "
        + " / ".join(dict.fromkeys(f"{x:g}x" for x in res.large_factor.values()))
        + " its recorded tokens (checked on the replay's own `routing.npz`: "
        + ("true in every step and layer of every run" if all(res.large_matches.values())
           else "FALSE for " + ", ".join(r for r, ok in res.large_matches.items() if not ok))
        + "). The expert loads and the busiest rank's share are therefore exactly the "
        "recorded ones; what the replay loses is the difference between source ranks' mixes "
        f"(each of the small run's ranks routed {tokens // lay['dp']} tokens; a rank of the "
        f"large run holds {lm['micro_batch'] * large.seq_len}, whose own mix would be closer "
        "to the step's).", "",
        "**Balanced baseline.** Each configuration again, timing only, with "
        "`moe.tokens='balanced'` (every expert receives the same share of each rank's "
        "choices; folded onto one process, exact). **Step time**: the slowest rank's "
        "iteration (`mpiemu analyze`'s \"slowest rank\" column, `analysis.run_breakdown`); "
        "slowdown = step / balanced step.", ""]


def _jobs(res: Results) -> list[str]:
    rows = job_rows(res)
    total = sum(r["wall_s"] for r in rows)
    return md_table(["run", "model", "tokens", "processes", "steps", "wall s", "check"],
                    align="llllrrl", rows=[[r["run"], r["model"], r["tokens"], r["processes"], r["steps"],
                      f"{r['wall_s']:.1f}", r["check"]] for r in rows]) + [
        "", f"{len(rows)} jobs, {res.workers} at a time (so their wall times overlap: "
        f"{total:.0f} s summed) on this machine ({os.cpu_count()} cores)."]


def _table(rows: Sequence[Row]) -> list[str]:
    head = ["run", "loss first -> last", "load max/mean: median (max)",
            "last quarter mean", "busiest EP rank: median (max)", "last quarter mean",
            "small slowdown", "large slowdown: median (max)", "large time over balanced"]
    body = []
    for run in _labels():
        loss, load, busy = (_of(rows, run, k) for k in
                            ("loss", "expert_load_max_over_mean", "busiest_ep_rank_over_mean"))
        if not len(loss):
            continue
        q = len(loss) * 3 // 4
        sd, big = _of(rows, run, "slowdown"), _of(rows, run, "large_slowdown")
        extra = _of(rows, run, "large_step_ms").sum() / _of(rows, run, "large_balanced_ms").sum()
        body.append([run, f"{loss[0]:.3f} -> {loss[-1]:.3f}",
                     f"{np.median(load):.2f} ({load.max():.2f})", f"{load[q:].mean():.2f}",
                     f"{np.median(busy):.2f} ({busy.max():.2f})", f"{busy[q:].mean():.2f}",
                     f"{_rng(sd, 4)}", f"{np.median(big):.3f} ({big.max():.3f})",
                     signed_pct(extra - 1)])
    return md_table(head, body)


def uniform_router(tokens: int, experts: int, top_k: int, ep: int, layers: int,
                   draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Median over `draws` steps of the worst layer's expert load max / mean and busiest EP
    rank / mean when every token picks its k experts uniformly at random (sampling noise
    alone, seeded)."""
    subsets = list(combinations(range(experts), top_k))         # each equally likely
    incidence = np.zeros((len(subsets), experts))
    for i, sub in enumerate(subsets):
        incidence[i, list(sub)] = 1
    picks = np.random.default_rng(seed).multinomial(
        tokens, np.full(len(subsets), 1 / len(subsets)), size=(draws, layers))
    c = picks @ incidence                                         # [draws, layers, E]
    load = (c.max(-1) / c.mean(-1)).max(-1)
    per_rank = c.reshape(draws, layers, ep, -1).sum(-1)
    busy = (per_rank.max(-1) / per_rank.mean(-1)).max(-1)
    return float(np.median(load)), float(np.median(busy))


def _findings(rows: Sequence[Row], layers: Sequence[Row], share: float) -> list[str]:
    f = figures()
    runs = [r for r in _labels() if len(_of(rows, r, "loss"))]
    load = {r: _of(rows, r, "expert_load_max_over_mean") for r in runs}
    busy = {r: _of(rows, r, "busiest_ep_rank_over_mean") for r in runs}
    big = {r: _of(rows, r, "large_slowdown") for r in runs}
    small = np.concatenate([_of(rows, r, "slowdown") for r in runs])
    n = len(load[runs[0]])
    q = n * 3 // 4
    worst = max(runs, key=lambda r: load[r][q:].mean())
    best = min(runs, key=lambda r: load[r][q:].mean())
    pred = {r: predicted(layers, r, share) for r in runs}
    err = np.concatenate([pred[r] - big[r] for r in runs])
    allb, allp = np.concatenate([big[r] for r in runs]), np.concatenate([pred[r] for r in runs])
    corr = float(np.corrcoef(allb, allp)[0, 1]) if allb.std() > 0 else math.nan
    loss_end = {r: float(_of(rows, r, "loss")[q:].mean()) for r in runs}
    spread = (max(loss_end.values()) - min(loss_end.values())) / min(loss_end.values())
    cfg, large = _cfg(False), _cfg(True)
    assert cfg.moe is not None
    ep = int(f["layout"]["ep"])
    per = cfg.moe.experts // ep
    tokens = int(f["batch"]["global_batch"]) * cfg.seq_len
    null_load, null_busy = uniform_router(tokens, cfg.moe.experts, cfg.moe.top_k, ep,
                                          cfg.layers)
    big_tokens = int(f["large_model"]["global_batch"]) * large.seq_len
    null_big, _ = uniform_router(big_tokens, cfg.moe.experts, cfg.moe.top_k, ep, cfg.layers)
    at0 = {r: f"{load[r][0]:.2f}" for r in runs}
    return [
        "## Findings", "",
        f"* **Imbalance.** Over the last quarter (steps {q}-{n - 1}) the worst layer's "
        "busiest expert holds on average "
        + ", ".join(f"{load[r][q:].mean():.2f}x ({r})" for r in runs)
        + f" the mean load, the busiest EP rank ({per} experts) "
        + ", ".join(f"{busy[r][q:].mean():.2f}x ({r})" for r in runs)
        + f": `{worst}` ends most imbalanced, `{best}` least. The worst layer first reaches "
        f"{HOT:g}x the mean load at "
        + ", ".join(f"{_first(load[r], HOT)} ({r})" for r in runs) + "; its peak is "
        + ", ".join(f"{load[r].max():.2f}x at step {int(load[r].argmax())} ({r})" for r in runs)
        + ". " + _hot(layers, worst, q),
        *_bias_words(cfg.moe, load, q),
        f"* **What sampling alone gives.** With {tokens} tokens per step a router that picks "
        "uniformly at random would still show a worst-layer load of "
        f"{null_load:.2f}x and a busiest EP rank of {null_busy:.2f}x (medians of seeded "
        f"draws); the first step, at initialisation, shows {at0[runs[0]]}x. The large "
        f"replay carries these counts as they are (x the factor above), while a real "
        f"{big_tokens}-token step would sample only {null_big:.2f}x: part of its early "
        "slowdown is the small batch's noise, not the router's preference.",
        "* **Loss.** Mean loss over the last quarter: "
        + ", ".join(f"{loss_end[r]:.4f} ({r})" for r in runs)
        + (f", within {pct(spread, 2)} of each other: on this synthetic data the balancing "
           "hardly changes what the model learns, only where its tokens go."
           if spread < 0.01 else f": {pct(spread, 1)} apart."),
        f"* **Small model, step time.** Slowdowns over the balanced step lie in "
        f"{_rng(small, 4)} over every step of every run"
        + (f": at hidden {cfg.hidden} an expert's GEMMs cost about the same whatever their "
           "tokens (launch and latency bound), so even the worst imbalance costs little "
           "time at this size." if small.max() < 1.02 else "."),
        f"* **Large model ({large.name} layer shapes), step time.** Slowdown over the "
        "balanced step: "
        + ", ".join(f"`{r}` {_rng(big[r], 3)} (median {np.median(big[r]):.3f}, last "
                    f"quarter {big[r][q:].mean():.3f})" for r in runs)
        + f". The experts' compute is {pct(share)} of the balanced step (ops "
        "`lN.experts.*` of the balanced trace), and every rank waits at each layer's "
        "all-to-all for the rank holding the most tokens, so the slowdown should be about "
        "1 + share x (mean over layers of the busiest EP rank's load - 1). That estimate "
        f"differs from the emulated slowdown by {signed_pct(float(err.mean()), 2)} on "
        f"average (at most {pct(float(np.abs(err).max()), 2)}; correlation {corr:.3f} over "
        f"all {len(allb)} steps); it leaves out the all-to-all's extra bytes into the "
        "busiest rank and the GEMMs' tile and wave rounding.", ""]


def _bias_words(moe: Any, load: dict[str, np.ndarray], q: int) -> list[str]:
    """What the expert-bias runs did, with the bias's step size (none without such a run)."""
    biased = [r["label"] for r in figures()["runs"] if "moe.expert_bias=true" in r["sets"]
              and r["label"] in load]
    out = []
    for r in biased:
        x = load[r]
        words = (f"* **`{r}`: the expert bias moves an expert's score by "
                 f"{moe.bias_update_rate:g} per step** (sign updates; "
                 f"{100 * moe.bias_update_rate:g} per hundred steps, against a mean softmax "
                 f"score of {1 / moe.experts:g} over {moe.experts} experts).")
        if x.max() >= HOT and x[q:].mean() < HOT:
            words += (f" Its worst layer first reaches {HOT:g}x at {_first(x, HOT)}, peaks at "
                      f"{x.max():.2f}x at step {int(x.argmax())} and is back to "
                      f"{x[q:].mean():.2f}x over the last quarter: the bias catches up with "
                      "what the router learns only after a phase far from balance.")
        out.append(words)
    return out


def _hot(layers: Sequence[Row], run: str, q: int) -> str:
    """Which expert is the hottest of each layer over the last quarter, how often."""
    mine = [r for r in layers if r["run"] == run and int(r["step"]) >= q]
    if not mine:
        return ""
    n_layers = 1 + max(int(r["layer"]) for r in mine)
    parts, shares = [], []
    for layer in range(n_layers):
        hot = [int(r["hottest_expert"]) for r in mine if int(r["layer"]) == layer]
        top = max(set(hot), key=hot.count)
        shares.append(hot.count(top) / len(hot))
        parts.append(f"layer {layer} expert {top} in {pct(shares[-1], 0)}")
    return (f"In `{run}` the hottest expert of each layer over the last quarter: "
            f"{'; '.join(parts)} of the steps"
            + (" (one expert stays hot: a preference the router learned, not noise)."
               if min(shares) >= 0.5 else "."))


def markdown(res: Results, rows: Sequence[Row], layers: Sequence[Row], share: float,
             wall_s: float) -> list[str]:
    f = figures()
    small, large = _cfg(False), _cfg(True)
    checked = {r: d for r, d in res.replay_diff_s.items() if d is not None}
    replay = ("The per-step check: the recorded choices of "
              + ", ".join(f"`{r}`" for r in checked)
              + " replayed timing only on the same configuration (`moe.tokens='trace'`) give "
              + ("step times equal to the numerics run's in every step (largest difference "
                 f"{max(checked.values()):.3g} s): numerics and timing are independent, so a "
                 "step's time is its routing's alone."
                 if checked and max(checked.values()) == 0 else
                 f"step times that differ from the numerics run's by up to "
                 f"{max(checked.values()):.3g} s.")
              + " (`--replay-all` checks every run.)"
              if checked else "No numerics run was replayed this time (`--replay-all`).")
    lay = f["layout"]
    one = " ".join(f'--set "{s}"' for s in base_sets(False))
    return [
        "# MoE routing imbalance over training, and what it costs in step time", "",
        "Generated by `mpiemu report moe_imbalance` (`mpiemu/studies/moe_imbalance.py`, "
        "setup in `moe_imbalance.toml`) in "
        f"{wall_s:.0f} s on this machine ({os.cpu_count()} cores; 1-minute load average "
        f"{os.getloadavg()[0]:.1f} at the end, other work sharing them). A timing-only simulator "
        "has to be told how tokens spread over experts; here a small MoE model trains for "
        "real on every rank (numpy, its shard of the experts), its router decides each "
        "step, and the emulated step time of that routing is set beside the same step under "
        "forced balance, for three ways of balancing. No paper is reproduced; every number "
        "below comes from these runs.", "",
        *_setup(res, small, large),
        *_jobs(res), "",
        replay, "",
        *_findings(rows, layers, share),
        "## Per run", "",
        *_table(rows), "",
        f"Load max/mean: the worst layer's busiest expert over the mean of its {small.moe.experts} "
        f"experts; busiest EP rank: the worst layer's most loaded rank (its "
        f"{small.moe.experts // lay['ep']} experts' received tokens) over the mean of the "
        f"{lay['ep']}. Small and large slowdown: step time over the balanced step of the same "
        "configuration; large time over balanced: the sum over all steps.", "",
        f"![loss, load and step time per step]({PNG})", "",
        "## Caveats", "",
        "* The small model's router is not Mixtral's: the large runs put the small model's "
        "routing, step by step, under Mixtral's layer shapes. How imbalanced a real Mixtral "
        "gets, and when, depends on its own router, data and scale.",
        "* The data are synthetic (a learnable recurrence): the tokens' variety, and with it "
        "the router's preferences, are not a natural corpus's.",
        "* Dropless routing (no capacity factor): an overloaded expert takes every token, so "
        "imbalance costs time, not tokens. With a capacity factor it would cost dropped "
        "tokens instead.",
        "* The large model's step includes everything a step has (attention, the optimizer "
        "on each rank's experts, the DP all-reduce), so the slowdown is diluted by the "
        "parts that imbalance does not touch.", "",
        "## Files", "",
        "* `steps.csv`: per step and run: loss, load max/mean and busiest EP rank (worst "
        "layer), step and balanced step time and slowdown, small and large model (ms).",
        "* `layers.csv`: the same loads per layer, with each layer's hottest expert.",
        "* `runs.csv`: every job: processes, wall time, its check.",
        f"* `{PNG}`: loss; loads; step time against the balanced one, small and large.", "",
        "Reproduce one numerics run by hand and look at its routing:", "",
        "```sh",
        f"mpiexec -n {lay['dp'] * lay['tp'] * lay['pp']} mpiemu run workloads/quickstart.toml "
        f"{one} --out runs/moe-aux",
        "mpiemu analyze runs/moe-aux          # per iteration; routing in runs/moe-aux/routing.npz",
        "```",
    ]


def plot(rows: Sequence[Row], path: Path) -> None:
    """Per run (columns): loss; loads; small and large step time against balanced."""
    pyplot = plt()
    runs = [r for r in _labels() if len(_of(rows, r, "loss"))]
    fig, axes = pyplot.subplots(4, len(runs), figsize=(4.2 * len(runs), 11), sharex=True,
                                sharey="row", squeeze=False)
    for c, run in enumerate(runs):
        step = _of(rows, run, "step")
        ax = axes[0][c]
        ax.plot(step, _of(rows, run, "loss"), color="tab:blue", lw=1)
        ax.set_title(run)
        ax = axes[1][c]
        ax.plot(step, _of(rows, run, "expert_load_max_over_mean"), lw=0.8,
                label="busiest expert / mean")
        ax.plot(step, _of(rows, run, "busiest_ep_rank_over_mean"), lw=0.8,
                label="busiest EP rank / mean")
        ax.axhline(1.0, color="k", lw=0.5)
        for r, key, name in ((2, "", "small"),
                             (3, "large_", f"large ({figures()['large_model']['preset']} shapes)")):
            ax = axes[r][c]
            ax.plot(step, _of(rows, run, f"{key}step_ms"), lw=0.8, color="tab:red",
                    label=f"{name}: routed")
            ax.plot(step, _of(rows, run, f"{key}balanced_ms"), lw=1, color="k", ls="--",
                    label=f"{name}: balanced")
        axes[3][c].set_xlabel("step")
    axes[0][0].set_ylabel("loss")
    axes[1][0].set_ylabel("load, worst layer")
    axes[2][0].set_ylabel("small step (ms)")
    axes[3][0].set_ylabel("large step (ms)")
    for r in (1, 2, 3):
        axes[r][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    pyplot.close(fig)


def main(out_dir: Path, argv: list[str]) -> int:
    ap = study_parser("moe_imbalance", moe_imbalance.__doc__, raw=True)
    ap.add_argument("--steps", type=int, help="steps per run (default: the toml's "
                    f"{load_figures('moe_imbalance')['steps'].value})")
    ap.add_argument("--jobs", type=int, default=2, help="emulated jobs at a time (default 2)")
    ap.add_argument("--replay-all", action="store_true",
                    help="replay every numerics run on its own configuration (default: the "
                    "runs of the toml's replay_check)")
    args = study_args(ap, argv)
    out_dir = out_dir_of(args, out_dir)
    t0 = time.perf_counter()
    with runs_dir(args, "mpiemu-moe-imb-") as runs:
        res = study(runs, args.steps, replay=_labels() if args.replay_all else None,
                    workers=args.jobs)
        share = expert_share(runs / _labels()[0] / "large-balanced")
    write_csv(out_dir / "steps.csv", res.steps)
    write_csv(out_dir / "layers.csv", res.layers)
    write_csv(out_dir / "runs.csv", job_rows(res))
    plot(res.steps, out_dir / PNG)
    wall = time.perf_counter() - t0
    (out_dir / "README.md").write_text(
        "\n".join(markdown(res, res.steps, res.layers, share, wall)) + "\n")
    print(f"wrote {out_dir}/README.md and CSV/PNG beside it ({wall:.0f} s)")
    return 0

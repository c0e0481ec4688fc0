"""The order in which one pipeline stage runs forward and backward passes.

Each schedule is a list of `Pass`es per stage: F or B of micro-batch `micro` on model chunk
`chunk` (0 unless interleaved). Virtual stage `chunk * p + stage` holds the chunk's layers,
as Megatron-LM's interleaved schedule places them (Narayanan et al. 2021, 2.2.2).

- `gpipe`: every forward, then every backward (Huang et al. 2019; the simple reference);
- `1f1b`: p - s - 1 warm-up forwards, then one forward / one backward, then the cool-down
  backwards (PipeDream-Flush; Megatron-LM `forward_backward_pipelining_without_interleaving`);
- `interleaved`: v chunks per stage, micro-batches in groups of p, (p - s - 1) * 2 +
  (v - 1) * p warm-up forwards (Megatron-LM `forward_backward_pipelining_with_interleaving`,
  megatron/core/pipeline_parallel/schedules.py, `get_model_chunk_id`);
- `combined_steps`: one stage's combined 1F1B, a forward and a backward of two micro-batches
  run as one step whose expert all-to-alls overlap the other pass's compute.

`simulate` replays the orders with fixed pass times and no transfer cost: with uniform
stages the bubble is (p - 1) / m of the ideal time for GPipe and 1F1B, (p - 1) / (v m)
interleaved (Narayanan et al. 2021, 2.2.1-2.2.2).
"""
from __future__ import annotations

from typing import NamedTuple

SCHEDULES = ("gpipe", "1f1b", "interleaved")


class Pass(NamedTuple):
    """One forward ("F") or backward ("B") of micro-batch `micro` on model chunk `chunk`."""

    kind: str
    micro: int
    chunk: int = 0

    def __str__(self) -> str:
        return f"{self.kind}{self.micro}" + (f".{self.chunk}" if self.chunk else "")


def order(schedule: str, stages: int, stage: int, micro_batches: int,
          chunks: int = 1) -> list[Pass]:
    """The passes stage `stage` of `stages` runs in one step, in order."""
    p, s, m = stages, stage, micro_batches
    if schedule == "gpipe":
        return [Pass("F", i) for i in range(m)] + [Pass("B", i) for i in range(m)]
    if schedule == "1f1b":
        return _one_f_one_b(m, min(p - s - 1, m))
    if schedule == "interleaved":
        return _interleaved(p, s, m, chunks)
    raise ValueError(f"schedule {schedule!r}: choose one of {SCHEDULES}")


def _one_f_one_b(m: int, warm: int) -> list[Pass]:
    """`warm` forwards, then one forward / one backward, then the remaining backwards."""
    out = [Pass("F", i) for i in range(warm)]
    for i in range(m - warm):
        out += [Pass("F", warm + i), Pass("B", i)]
    return out + [Pass("B", i) for i in range(m - warm, m)]


def _interleaved(p: int, s: int, m: int, v: int, extra: int = 0) -> list[Pass]:
    """Megatron-LM's interleaved 1F1B (m a multiple of p): virtual micro-batch k maps to
    chunk (k mod pv) // p (reversed in backward) and micro-batch (k // pv) p + k mod p;
    `extra` more warm-up forwards (the combined 1F1B schedule's one)."""
    total = m * v
    warm = total if m == p else min((p - s - 1) * 2 + (v - 1) * p + extra, total)

    def at(k: int, forward: bool) -> Pass:
        chunk = (k % (p * v)) // p
        micro = (k // (p * v)) * p + k % p
        return Pass("F" if forward else "B", micro, chunk if forward else v - 1 - chunk)

    out = [at(k, True) for k in range(warm)]
    for k in range(total - warm):
        out += [at(warm + k, True), at(k, False)]
    return out + [at(k, False) for k in range(total - warm, total)]


def combined_steps(schedule: str, stages: int, stage: int, micro_batches: int,
                   chunks: int = 1) -> list[list[Pass]]:
    """One stage's combined 1F1B (Megatron-Core --overlap-moe-expert-parallel-comm): one
    more warm-up forward than the schedule's, then each steady forward with the backward
    beside it as one step (`combined_1f1b.py`: F0, (F1, B0), ... at one stage; interleaved,
    schedules.py `num_warmup_microbatches += 1`), then the remaining backwards. One more
    micro-batch is in flight."""
    if schedule == "interleaved":
        passes = _interleaved(stages, stage, micro_batches, chunks, extra=1)
    else:
        passes = _one_f_one_b(micro_batches, min(stages - stage, micro_batches))
    out: list[list[Pass]] = []
    for ps in passes:
        if out and ps.kind == "B" and len(out[-1]) == 1 and out[-1][0].kind == "F":
            out[-1].append(ps)
        else:
            out.append([ps])
    return out


def in_flight(passes: list[Pass]) -> int:
    """Most (micro-batch, chunk) forwards whose backward has not run yet: the activations
    a stage holds at its peak."""
    live = peak = 0
    for ps in passes:
        live += 1 if ps.kind == "F" else -1
        peak = max(peak, live)
    return peak


def simulate(schedule: str, stages: int, micro_batches: int, chunks: int,
             forward_s: float, backward_s: float) -> list[float]:
    """End time of every stage when each chunk's forward takes `forward_s` and backward
    `backward_s` and messages are free (the textbook bubble)."""
    steps = [[[ps] for ps in order(schedule, stages, s, micro_batches, chunks)]
             for s in range(stages)]
    return simulate_steps(steps, stages, chunks, forward_s, backward_s)


def simulate_steps(steps: list[list[list[Pass]]], stages: int, chunks: int,
                   forward_s: float, backward_s: float) -> list[float]:
    """`simulate` of each stage's steps: a step starts when every pass in it may (their
    inputs received first, as `training.pipeline_step` runs them) and takes their sum;
    RuntimeError when the stages would wait on each other for ever."""
    p, v = stages, chunks
    done: dict[tuple[str, int, int], float] = {}
    free, pos = [0.0] * p, [0] * p
    while any(pos[s] < len(steps[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            while pos[s] < len(steps[s]):
                deps = [d for ps in steps[s][pos[s]] for d in _deps(ps, s, p, v)]
                if any(d not in done for d in deps):
                    break
                start = max([free[s]] + [done[d] for d in deps])
                for ps in steps[s][pos[s]]:
                    start += forward_s if ps.kind == "F" else backward_s
                    done[(ps.kind, ps.micro, ps.chunk * p + s)] = start
                free[s] = start
                pos[s] += 1
                progressed = True
        if not progressed:
            raise RuntimeError(f"the stages' steps wait on each other at positions {pos}")
    return free


def _deps(ps: Pass, s: int, p: int, v: int) -> list[tuple[str, int, int]]:
    """The passes of other virtual stages (and its own forward) a pass waits for."""
    vs = ps.chunk * p + s
    if ps.kind == "F":
        return [("F", ps.micro, vs - 1)] if vs > 0 else []
    return [("F", ps.micro, vs)] + ([("B", ps.micro, vs + 1)] if vs < p * v - 1 else [])


def bubble_fraction(schedule: str, stages: int, micro_batches: int, chunks: int = 1,
                    forward_s: float = 1.0, backward_s: float = 2.0) -> float:
    """(iteration - ideal) / ideal of `simulate`; ideal = m v (forward + backward)."""
    end = max(simulate(schedule, stages, micro_batches, chunks, forward_s, backward_s))
    ideal = micro_batches * chunks * (forward_s + backward_s)
    return (end - ideal) / ideal

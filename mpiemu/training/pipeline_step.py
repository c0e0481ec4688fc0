"""One training step of a pipeline stage: the schedule's passes, with activations and their
gradients sent between stage ranks as real point-to-point messages.

Virtual stage vs = chunk * p + stage sends its forward output to vs + 1 (stage + 1, or the
next chunk of stage 0 after the last stage) and its input gradient to vs - 1. Sends are
non-blocking (the sender's egress port is reserved from when the output exists; compute goes
on, as Megatron-LM's isend), receives wait for the message's arrival (its timestamp). With
numerics on the payload is the real [rows / tp under SP, H] tensor; otherwise the header
alone carries its timing (SimGrid: payload apart from cost). Tags: 2 x (receiving chunk) for
activations, + 1 for gradients, so each (sender, receiver, tag) stream is FIFO in
micro-batch order on both sides.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..comm.p2p import SendHandle, TimedComm
from ..model.executor import Array
from ..model.steps import Steps, drain
from ..model.pipeline_schedules import Pass, combined_steps, order
from ..model.stage import StageModel
from .gradients import StageGradients

# emulator detail: a stage waits long for its neighbour (warm-up, bubbles, and on an
# oversubscribed host every other stage's turn), so it tests at most every 10 ms instead of
# every 1 ms (comm.p2p.wait_all): 64 stages on 2 cores spent a third of the CPU polling
STAGE_MAX_SLEEP_S = 10e-3


class PipelineStep:
    """Runs one stage's passes in schedule order around a `StageModel`, its gradients
    handled by `StageGradients`; under the combined 1F1B schedule (`combined`) a forward
    and a backward of two micro-batches as one step (`_combined`)."""

    def __init__(self, model: StageModel, grads: StageGradients, pp: TimedComm | None,
                 schedule: str, micro_batches: int, np_dtype: type,
                 combined: bool = False) -> None:
        self.model, self.grads, self.pp, self.np_dtype = model, grads, pp, np_dtype
        self.p, self.s, self.v = model.pp, model.pp_rank, model.chunks
        plan = (schedule, self.p, self.s, micro_batches, self.v)
        self.steps = combined_steps(*plan) if combined else [[ps] for ps in order(*plan)]
        d = model.d
        self.shape = (d.shard_rows, d.hidden)
        self.nbytes = d.shard_rows * d.hidden * model.E.e
        # told (iteration, passes done, passes) before each pass: progress in long steps
        self.heartbeat: Callable[[int, int, int], None] | None = None

    def run(self, iteration: int) -> float:
        """Every pass of the step, then the gradient reductions; this rank's loss share."""
        m = self.model
        m.begin_step(iteration)
        self.grads.begin_step()
        sends: list[SendHandle] = []
        for k, step in enumerate(self.steps):
            if self.heartbeat is not None:
                self.heartbeat(iteration, k, len(self.steps))
            # every input the step needs arrives first, then its passes run, then the
            # outputs leave (Megatron's send_forward_backward_recv_forward_backward)
            inputs = [self._input(ps) for ps in step]
            outs = self._combined(step, inputs) if len(step) == 2 else \
                [drain(self._steps(step[0], inputs[0]))]
            for ps, out in zip(step, outs):
                h = self._output(ps, out)
                if h is not None:
                    sends.append(h)
        for h in sends:           # every payload is out before its buffer is released
            h.wait()
        self.grads.finish_step()
        return float(m.loss)

    def _steps(self, ps: Pass, x: Array) -> Steps[Array]:
        m = self.model
        return m.forward_steps(ps, x) if ps.kind == "F" else m.backward_steps(ps, x)

    def _input(self, ps: Pass) -> Array:
        """The forward's activation from the previous virtual stage, or the backward's
        gradient from the next (None at the ends)."""
        vs, last = ps.chunk * self.p + self.s, self.p * self.v - 1
        if ps.kind == "F":
            return self._recv(vs - 1, ps, "F") if vs > 0 else None
        return self._recv(vs + 1, ps, "B") if vs < last else None

    def _output(self, ps: Pass, out: Array) -> SendHandle | None:
        """The pass's output sent on (None at the ends)."""
        vs, last = ps.chunk * self.p + self.s, self.p * self.v - 1
        if ps.kind == "F":
            return self._send(out, vs + 1, ps, "F") if vs < last else None
        return self._send(out, vs - 1, ps, "B") if vs > 0 else None

    def _combined(self, step: list[Pass], inputs: list[Array]) -> list[Array]:
        """A forward and a backward of two micro-batches as one step: their steps run in
        turn, each from its own cursor, so that one's expert all-to-all moves under the
        other's compute (Megatron-Core `TransformerLayerSchedulePlan.run`,
        models/common/model_chunk_schedule_plan.py @01cf4fb5: the backward's combine under
        the forward's attention, the forward's dispatch under the backward's experts, the
        backward's dispatch under the forward's experts, the forward's combine under the
        backward's attention; the backward goes first). The step ends when both have; their
        outputs, forward's first."""
        E = self.model.E
        (f, x), (b, dy) = zip(step, inputs)
        start = E.pass_state()
        runs = [self._steps(b, dy), self._steps(f, x)]
        states, outs, live, k = [start, start], [None, None], [True, True], 0
        while any(live):
            if live[k]:
                E.resume(states[k])
                try:
                    next(runs[k])
                except StopIteration as done:
                    live[k], outs[k] = False, done.value
                states[k] = E.pass_state()
            k = 1 - k
        E.resume(start._replace(t=max(st.t for st in states)))
        return [outs[1], outs[0]]

    def _tag(self, to_vs: int, kind: str) -> int:
        return 2 * (to_vs // self.p) + (kind == "B")

    def _send(self, buf: Array, to_vs: int, ps: Pass, kind: str) -> SendHandle:
        assert self.pp is not None
        E = self.model.E
        return self.pp.isend(None if buf is None else np.ascontiguousarray(buf),
                             to_vs % self.p, self._tag(to_vs, kind), self.nbytes, E.t,
                             label=f"pp.send.{kind}{ps.micro}.{ps.chunk}")

    def _recv(self, from_vs: int, ps: Pass, kind: str) -> Array:
        assert self.pp is not None
        E = self.model.E
        my_vs = ps.chunk * self.p + self.s
        buf: Array = np.empty(self.shape, self.np_dtype) if E.on else None
        h = self.pp.irecv(buf, from_vs % self.p, self._tag(my_vs, kind), E.t)
        E.wait_until(h.wait(STAGE_MAX_SLEEP_S))
        return buf

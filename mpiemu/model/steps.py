"""A pass written as steps: a generator that yields where another micro-batch's work may run
while its own waits (an expert-parallel all-to-all in flight: Megatron-Core's combined 1F1B
schedule, `training.pipeline_step`) and returns the pass's result. Run alone, a pass's steps
follow one another (`drain`)."""
from __future__ import annotations

from typing import Generator, TypeVar

T = TypeVar("T")
Steps = Generator[None, None, T]


def drain(steps: Steps[T]) -> T:
    """The steps run to the end, nothing between them: their result."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

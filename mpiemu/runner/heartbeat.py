"""Rank 0's progress inside a long training iteration (`mpiemu run --heartbeat`)."""
from __future__ import annotations

import sys
import time


class Heartbeat:
    """Rank 0's progress inside a long iteration (the iteration lines come only at its end:
    a 512-GPU folded iteration takes seconds, a 64-rank one minutes): on a terminal, a bar
    of its pipeline stage's passes redrawn in place a few times a second; elsewhere (a log,
    or under mpiexec, which pipes the ranks' output) a line every `every_s` seconds."""

    BAR_S = 0.2        # a bar's redraws at most this often (or every `every_s`, if sooner)
    WIDTH = 24

    def __init__(self, every_s: float, stage: int, tty: bool | None = None) -> None:
        self.every_s, self.stage = every_s, stage
        self.tty = sys.stdout.isatty() if tty is None else tty
        self.t0 = self.last = time.perf_counter()

    def __call__(self, iteration: int, done: int, passes: int) -> None:
        now = time.perf_counter()
        if done == 0:
            self.t0 = now
            if iteration == 0:
                self.last = now
        if self.tty and now - self.last >= min(self.BAR_S, self.every_s):
            self.last = now
            full = self.WIDTH * done // max(passes, 1)
            sys.stdout.write(f"\r     iteration {iteration} [{'#' * full:<{self.WIDTH}}] "
                             f"{done}/{passes} passes of stage {self.stage}, "
                             f"{now - self.t0:.0f} s\033[K")
            sys.stdout.flush()
        elif not self.tty and now - self.last >= self.every_s:
            self.last = now
            sys.stdout.write(f"     iteration {iteration}: {done} of {passes} passes of stage "
                             f"{self.stage} done ({now - self.t0:.0f} s)\n")
            sys.stdout.flush()

"""The run's watchman: marks the manifest `failed` when every rank of this host died without
a word (SIGKILL, the out-of-memory killer), naming the rank that died first.

A rank that raises, or gets SIGINT / SIGTERM, marks the manifest itself (`context.mark_failed`).
A rank killed outright cannot, and the launcher then kills the others just as hard, so rank 0
starts this small process in its own session beside the job (`python -m mpiemu.run.watch
RUN_DIR RANK:PID ...`): it polls the ranks' pids and, once all are gone while the manifest
still says `running`, writes `failed` with the ranks first seen dead (`failed_rank` the lowest
of them, `cause` all of them: ranks killed within one poll cannot be told apart). It exits as soon as the
manifest says anything else (the ranks spoke for themselves) or the ranks are gone. Readers also recognise a `running` manifest with no live
process (`analysis.load`), for when the watchman itself was killed.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from .._proc import alive

POLL_S = 0.05


def _status(out: Path) -> str | None:
    try:
        return json.loads((out / "manifest.json").read_text()).get("status")
    except (OSError, ValueError):
        return None


def watch(out: Path, ranks: dict[int, int]) -> None:
    """Poll until every pid of `ranks` (rank -> pid) is gone, or the run has ended in
    words (the manifest no longer says `running`); mark a silent death."""
    first_seen: list[int] = []          # the ranks found dead at the first poll that saw any
    polls = 0
    while True:
        dead = [r for r, pid in ranks.items() if not alive(pid)]
        if not first_seen and dead:
            first_seen = dead
        if len(dead) == len(ranks):
            break
        polls += 1
        if polls % 20 == 0 and _status(out) != "running":
            return                   # complete, failed or interrupted: said by the ranks
        time.sleep(POLL_S)
    if _status(out) == "running" and first_seen:
        from .context import mark_failed  # noqa: PLC0415 (only on a death: keep start-up light)
        mark_failed(out, min(first_seen), float("nan"), "failed")
        manifest = json.loads((out / "manifest.json").read_text())
        manifest["cause"] = (f"every rank on this host was killed without a word (SIGKILL, "
                             f"out of memory); ranks {first_seen} were gone first")
        from .context import write_manifest  # noqa: PLC0415
        write_manifest(out, manifest)


def main(argv: list[str]) -> int:
    out, pairs = Path(argv[0]), argv[1:]
    watch(out, {int(r): int(p) for r, p in (x.split(":") for x in pairs)})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""What the reports of measured-run studies share (`llama_report`, `moe_report`): their
command line, which rows were emulated, values at their worth, the agreement sentence of a
headline, and sentences picked from a source text."""
from __future__ import annotations

import argparse
import re
import statistics

from .common import Row, pct, signed_pct, study_args, study_parser


def report_args(study: str, doc: str | None, argv: list[str]) -> argparse.Namespace:
    """`mpiemu report STUDY`'s options: --out, --keep-runs and --reuse."""
    ap = study_parser(study, doc)
    ap.add_argument("--reuse", action="store_true",
                    help="with --keep-runs: take complete runs with the same overrides already "
                         "there instead of running them again (they must come from this code)")
    return study_args(ap, argv)


def emulated(rows: list[Row]) -> list[Row]:
    """The rows that ran (an emulated value beside the measured one)."""
    return [r for r in rows if r["ours"] is not None]


def num(x: float) -> str:
    """A measured or emulated value at the precision it is worth."""
    return f"{x:.2f}" if x < 100 else f"{x:,.0f}"


def agreement(em: list[Row], band: float) -> str:
    """'N of M within the band; median and worst |difference|' of emulated rows."""
    errs = [abs(r["difference"]) for r in em]
    worst = max(em, key=lambda r: abs(r["difference"]))
    return (f"{sum(e <= band for e in errs)} of {len(em)} within {pct(band, 0)} of the "
            f"measurement; median |difference| {pct(statistics.median(errs))}, worst "
            f"{signed_pct(worst['difference'])} (`{worst['id']}`)")


def sentences(text: str, keys: tuple[str, ...]) -> list[str]:
    """The sentences of `text` that mention any of `keys`."""
    return [s.strip() for s in re.split(r"(?<=\.) (?=[A-Z(])", text)
            if any(k in s for k in keys)]

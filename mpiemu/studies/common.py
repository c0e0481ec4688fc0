"""What every study shares: sourced data files, deterministic CSVs, golden comparison, Markdown.

A study's paper numbers live in `<study>.toml` beside its module, one table per figure:
`[fig_name] value = 1.25, source = "seed 004 Fig. 8"` (a `value` may be a list or a string).
`load_figures` refuses an entry without a source, so no number enters a report unsourced.
CSV floats are written with 6 significant digits, so a golden comparison is exact on text.
"""
from __future__ import annotations

import argparse
import csv
import difflib
import io
import math
import tempfile
import tomllib
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

Row = dict[str, Any]


def study_parser(study: str, doc: str | None, raw: bool = False) -> argparse.ArgumentParser:
    """`mpiemu report STUDY`'s parser with the options of every study that runs jobs: --out
    and --keep-runs (`raw`: the description's own line breaks kept)."""
    ap = argparse.ArgumentParser(prog=f"mpiemu report {study}", description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter if raw
                                 else argparse.HelpFormatter)
    ap.add_argument("--out", type=Path, help="output directory (as `mpiemu report --out`)")
    ap.add_argument("--keep-runs", type=Path, help="keep the run directories here")
    return ap


def study_args(ap: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """The report's options (a `--` that `mpiemu report` passes along left out)."""
    return ap.parse_args([a for a in argv if a != "--"])
ROOT = Path(__file__).resolve().parents[2]


def out_dir_of(args: argparse.Namespace, default: Path) -> Path:
    """The report's output directory (`--out`, else the study's), made."""
    out: Path = args.out or default
    out.mkdir(parents=True, exist_ok=True)
    return out


@contextmanager
def runs_dir(args: argparse.Namespace, prefix: str) -> Iterator[Path]:
    """Where the study's runs go: `--keep-runs` (kept), else a temporary directory removed
    after the report."""
    if args.keep_runs:
        yield args.keep_runs
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        yield Path(tmp)


class StudyDataError(ValueError):
    """A study data file entry without a value or a source."""


@dataclass(frozen=True)
class Figure:
    """One number (or list, or label) a paper states, with where it states it."""

    value: Any
    source: str

    def __float__(self) -> float:
        return float(self.value)

    def __int__(self) -> int:
        return int(self.value)


def load_figures(study: str) -> dict[str, Figure]:
    """Every `[name] value = .., source = ..` table of `mpiemu/studies/<study>.toml`."""
    text = (resources.files("mpiemu.studies") / f"{study}.toml").read_text()
    raw = tomllib.loads(text)
    out: dict[str, Figure] = {}
    for name, entry in raw.items():
        if not isinstance(entry, dict) or "value" not in entry \
                or not str(entry.get("source", "")).strip():
            raise StudyDataError(f"{study}.toml [{name}]: every figure needs a value and a source")
        out[name] = Figure(entry["value"], str(entry["source"]))
    return out


def fmt_cell(v: Any) -> str:
    """How a CSV cell is written: floats with 6 significant digits, None as empty."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def csv_text(rows: Sequence[Mapping[str, Any]]) -> str:
    """The CSV text of rows (header from the first row), as `write_csv` writes it."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    keys = list(rows[0])
    w.writerow(keys)
    for r in rows:
        w.writerow([fmt_cell(r[k]) for k in keys])
    return buf.getvalue()


def write_csv(path: Path, rows: Sequence[Mapping[str, Any]]) -> Path:
    path.write_text(csv_text(rows))
    return path


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


@dataclass(frozen=True)
class Golden:
    """Rows a study regenerates for its golden test, and which committed rows they cover."""

    csv: str                                   # file name under results/<study>/
    rows: list[Row]
    covers: Callable[[dict[str, str]], bool] = lambda r: True


def golden_diff(committed: Path, golden: Golden) -> list[str]:
    """Unified diff between the committed rows `golden` covers and the regenerated ones."""
    old = [r for r in read_csv(committed) if golden.covers(r)]
    if not old:
        return [f"{committed}: no committed rows are covered"]
    new_text = csv_text(golden.rows).splitlines()
    old_text = csv_text(old).splitlines()
    return list(difflib.unified_diff(old_text, new_text, f"committed {committed}",
                                     "regenerated from the models", n=1, lineterm=""))


def geomean(xs: Iterable[float]) -> float:
    vals = list(xs)
    return math.exp(sum(math.log(x) for x in vals) / len(vals)) if vals else math.nan


def md_table(head: Sequence[str], rows: Iterable[Sequence[Any]], align: str = "") -> list[str]:
    """A Markdown table; `align` is one char per column ('l' or 'r', default 'r' but first)."""
    al = align or "l" + "r" * (len(head) - 1)
    sep = "|" + "|".join("---" if a == "l" else "---:" for a in al) + "|"
    out = ["| " + " | ".join(head) + " |", sep]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return out


def pct(x: float, digits: int = 1) -> str:
    return f"{100 * x:.{digits}f}%" if math.isfinite(x) else "-"


def signed_pct(x: float, digits: int = 1) -> str:
    return f"{100 * x:+.{digits}f}%" if math.isfinite(x) else "-"


def plt() -> Any:
    """matplotlib.pyplot on the Agg backend, imported only when a report is written."""
    import matplotlib  # noqa: PLC0415
    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot  # noqa: PLC0415
    return pyplot

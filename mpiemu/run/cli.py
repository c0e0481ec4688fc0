"""The `mpiemu` command line: run, devices, analyze (every rank parses the same argv)."""
from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence

COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {}


def _command(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    COMMANDS[fn.__name__.removeprefix("cmd_")] = fn
    return fn


@_command
def cmd_run(args: argparse.Namespace) -> int:
    """Run a workload under MPI (every rank)."""
    from .runner import run_workload  # noqa: PLC0415 - MPI starts only for `run`
    run_workload(args.workload, args.set or [], args.out, sys.argv)
    return 0


@_command
def cmd_devices(args: argparse.Namespace) -> int:
    """List device presets with their numbers, sources and assumptions."""
    from .devices import format_devices  # noqa: PLC0415
    sys.stdout.write("\n".join(format_devices(args.name, brief=args.brief)) + "\n")
    return 0


@_command
def cmd_analyze(args: argparse.Namespace) -> int:
    """Per-rank and per-op tables of a run directory."""
    from ..analysis import format_tables, load  # noqa: PLC0415
    sys.stdout.write("\n".join(format_tables(load(args.run_dir), top=args.top)) + "\n")
    return 0


@_command
def cmd_report(args: argparse.Namespace) -> int:
    """Regenerate a report under results/ from the project's own models and runs."""
    from pathlib import Path  # noqa: PLC0415

    from .reports import run_report  # noqa: PLC0415
    return run_report(args.name, Path(args.out) if args.out else None, args.extra)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mpiemu", description="Emulate accelerators with MPI ranks.")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run a workload (launch with mpiexec -n N)")
    r.add_argument("workload", help="workload TOML file")
    r.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a workload key, e.g. --set parallel.tp=2 (repeatable)")
    r.add_argument("--out", help="run directory (default runs/<workload name>)")
    d = sub.add_parser("devices", help="list device presets with sources")
    d.add_argument("name", nargs="?", help="one preset only")
    d.add_argument("--brief", action="store_true", help="the summary table only")
    a = sub.add_parser("analyze", help="tables of a run directory")
    a.add_argument("run_dir")
    a.add_argument("--top", type=int, default=25, help="rows of the per-op table")
    rep = sub.add_parser("report", help="regenerate a report under results/ (t3, sunway)")
    rep.add_argument("name")
    rep.add_argument("--out", help="output directory (default results/<name>)")
    rep.add_argument("extra", nargs=argparse.REMAINDER, help="arguments for the report")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except (FileNotFoundError, ValueError) as exc:
        if args.command == "run":
            raise          # under MPI: the excepthook names the rank and aborts the job
        from .errors import one_line  # noqa: PLC0415
        sys.stderr.write(f"mpiemu {args.command}: error: {one_line(exc)}\n")
        return 2


if __name__ == "__main__":
    raise SystemExit(main())

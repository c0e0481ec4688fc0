"""The `mpiemu` command line: run, devices, analyze (every rank parses the same argv)."""
from __future__ import annotations

import argparse
import atexit
import ctypes
import sys
from typing import Any, Callable, Sequence

from ._proc import manual_gc
from ._threads import pin_rank

COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {}


def _command(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    COMMANDS[fn.__name__.removeprefix("cmd_")] = fn
    return fn


@_command
def cmd_run(args: argparse.Namespace) -> int:
    """Run a workload under MPI (every rank)."""
    pin_rank()                  # before MPI_Init: threads it starts inherit the core
    from .runner.job import run_workload  # noqa: PLC0415 - MPI starts only for `run`
    from .runner.context import LogOptions  # noqa: PLC0415
    log = LogOptions(args.quiet, args.log_interval, args.heartbeat)
    summary = run_workload(args.workload, args.set or [], args.out, sys.argv, log=log,
                           force=args.force)
    check = summary.get("reference")
    return 3 if isinstance(check, dict) and not check.get("passed", True) else 0


@_command
def cmd_devices(args: argparse.Namespace) -> int:
    """List device presets with their numbers, sources and assumptions."""
    from .config.listing import format_devices, format_networks  # noqa: PLC0415
    if args.set and not args.name:
        raise ValueError("devices --set needs a preset NAME")
    fmt = format_networks if args.network else format_devices
    lines = fmt(args.name, brief=args.brief, overrides=args.set or [])
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def _load(args: argparse.Namespace, run_dir: str) -> Any:
    """A run directory, refused in one line if damaged, or (--allow-incomplete) what is
    sound, with a note on stderr for each part left out."""
    from .analysis import load  # noqa: PLC0415
    run = load(run_dir, allow_incomplete=getattr(args, "allow_incomplete", False))
    for p in run.problems:
        sys.stderr.write(f"mpiemu {args.command}: note: left out {p}\n")
    return run


@_command
def cmd_analyze(args: argparse.Namespace) -> int:
    """Per-rank and per-op tables of a run directory."""
    from .analysis import format_tables  # noqa: PLC0415
    run = _load(args, args.run_dir)
    if args.json:
        import json  # noqa: PLC0415

        from .analysis.summary import summary_dict  # noqa: PLC0415
        sys.stdout.write(json.dumps(summary_dict(run, args.top), indent=1, default=float) + "\n")
        return 0
    sys.stdout.write("\n".join(format_tables(run, top=25 if args.top is None else args.top))
                     + "\n")
    return 0


@_command
def cmd_workloads(args: argparse.Namespace) -> int:
    """The bundled workloads (`mpiemu run NAME` runs one), or a copy of them to edit."""
    import shutil  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    from .workloads import bundled, describe  # noqa: PLC0415
    if args.copy:
        dest = Path(args.copy)
        dest.mkdir(parents=True, exist_ok=True)
        for f in bundled():
            if (dest / f.name).exists():
                raise ValueError(f"--copy={args.copy!r}: {f.name} is there already (a "
                                 "directory without bundled workloads, or a new one)")
        for f in bundled():
            shutil.copyfile(f, dest / f.name)
        sys.stdout.write(f"copied {len(bundled())} workloads to {dest}/\n")
        return 0
    for f in bundled():
        sys.stdout.write(f"{f.stem:<34} {describe(f)}\n")
    return 0


@_command
def cmd_completion(args: argparse.Namespace) -> int:
    """A bash completion script (`eval "$(mpiemu completion)"`; zsh: after bashcompinit)."""
    from .completion import bash_script  # noqa: PLC0415
    sys.stdout.write(bash_script(build_parser()))
    return 0


@_command
def cmd_export(args: argparse.Namespace) -> int:
    """A run for Perfetto (its protobuf, or trace-event JSON) and for Holistic Trace
    Analysis (one file per rank)."""
    from .analysis.export import write_chrome  # noqa: PLC0415
    from .analysis.hta import write_hta  # noqa: PLC0415
    from .analysis.select import parse_ids, parse_window, select  # noqa: PLC0415
    if not (args.chrome or args.hta or args.perfetto):
        raise ValueError("export needs --perfetto FILE, --chrome FILE and/or --hta DIR")
    part = (None if args.ranks is None else parse_ids(args.ranks, "--ranks"),
            None if args.iterations is None else parse_ids(args.iterations, "--iterations"),
            None if args.window is None else parse_window(args.window))
    run = select(_load(args, args.run_dir), *part)
    if args.perfetto:
        from .analysis.perfetto_proto import write_perfetto  # noqa: PLC0415
        sys.stdout.write(f"wrote {write_perfetto(run, args.perfetto)} "
                         "(open in ui.perfetto.dev)\n")
    if args.chrome:
        sys.stdout.write(f"wrote {write_chrome(run, args.chrome)} (open in ui.perfetto.dev)\n")
    if args.hta:
        sys.stdout.write(f"wrote {len(write_hta(run, args.hta))} rank files to {args.hta}\n")
    return 0


@_command
def cmd_compare(args: argparse.Namespace) -> int:
    """Makespan speedup and per-op differences of run B over run A."""
    from .analysis.compare import compare_dict, compare_lines  # noqa: PLC0415
    a, b = _load(args, args.a), _load(args, args.b)
    if args.json:
        import json  # noqa: PLC0415
        sys.stdout.write(json.dumps(compare_dict(a, b, args.top), indent=1) + "\n")
        return 0
    lines = compare_lines(a, b, top=20 if args.top is None else args.top)
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


@_command
def cmd_plot(args: argparse.Namespace) -> int:
    """Gantt PNG of a run's emulated timeline."""
    from pathlib import Path  # noqa: PLC0415

    from .analysis.plot import gantt  # noqa: PLC0415
    run = _load(args, args.run_dir)
    out = Path(args.out) if args.out else run.path / "timeline.png"
    png = gantt(run, out, t_min_ms=args.t_min, t_max_ms=args.t_max, ranks=args.ranks)
    sys.stdout.write(f"wrote {png}\n")
    return 0


@_command
def cmd_calibrate(args: argparse.Namespace) -> int:
    """Measure this host (and, under mpiexec -n 2, its MPI link) and write a preset."""
    from pathlib import Path  # noqa: PLC0415

    from .devices.calibrate import calibrate  # noqa: PLC0415
    lines = calibrate(Path(args.out))
    sys.stdout.write("".join(f"{line}\n" for line in lines))
    return 0


@_command
def cmd_report(args: argparse.Namespace) -> int:
    """Regenerate a study under results/ (`--list`: the studies and their seeds)."""
    from pathlib import Path  # noqa: PLC0415

    from .studies import STUDIES, list_lines, run_study  # noqa: PLC0415
    if args.list:
        sys.stdout.write("\n".join(list_lines()) + "\n")
        return 0
    if args.all:
        return max(run_study(name, None, []) for name in STUDIES)
    if not args.name:
        raise ValueError("report needs a study NAME, --all or --list")
    return run_study(args.name, Path(args.out) if args.out else None, args.extra)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mpiemu", description="Emulate accelerators with MPI ranks.")
    from . import __version__  # noqa: PLC0415
    p.add_argument("--version", action="version", version=f"mpiemu {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run a workload (launch with mpiexec -n N)")
    r.add_argument("workload", help="workload TOML file, or a bundled workload's name "
                   "(mpiemu workloads)")
    r.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a workload key, e.g. --set parallel.tp=2 (repeatable)")
    r.add_argument("--out", help="run directory (default runs/<workload name>)")
    r.add_argument("--force", action="store_true",
                   help="replace the run already in the run directory")
    r.add_argument("--quiet", action="store_true",
                   help="print the header and the last iteration only")
    r.add_argument("--log-interval", type=int, default=1, metavar="N",
                   help="print every N-th iteration's line (and the last)")
    r.add_argument("--heartbeat", type=float, default=10.0, metavar="S",
                   help="within an iteration, a progress line every S seconds of wall time "
                        "(rank 0; 0: none)")
    d = sub.add_parser("devices", help="list device (or --network) presets with sources")
    d.add_argument("name", nargs="?", help="one preset only")
    d.add_argument("--brief", action="store_true", help="the summary table only")
    d.add_argument("--network", action="store_true",
                   help="network presets instead of devices (NAME: one network)")
    d.add_argument("--set", action="append", metavar="device.PATH=VALUE",
                   help="show the preset with a capability overridden (repeatable)")
    a = sub.add_parser("analyze", help="tables of a run directory")
    a.add_argument("--json", action="store_true", help="JSON instead of tables")
    a.add_argument("--allow-incomplete", action="store_true",
                   help="analyse what is sound in a damaged run (notes on stderr)")
    a.add_argument("run_dir", help="a run directory (runs/<name>, or --out of mpiemu run)")
    a.add_argument("--top", type=int, default=None,
                   help="rows of the per-op table (25 unless given; -1: all; --json: all "
                        "unless given)")
    wl = sub.add_parser("workloads", help="the bundled workloads (mpiemu run NAME runs one)")
    wl.add_argument("--copy", metavar="DIR", help="copy them into DIR to edit")
    sub.add_parser("completion", help="bash completion: eval \"$(mpiemu completion)\"")
    e = sub.add_parser("export", help="a run for Perfetto (protobuf or JSON) and for HTA")
    e.add_argument("--allow-incomplete", action="store_true",
                   help="analyse what is sound in a damaged run (notes on stderr)")
    e.add_argument("run_dir", help="a run directory (runs/<name>, or --out of mpiemu run)")
    e.add_argument("--perfetto", help="output .pftrace: Perfetto's protobuf (all ranks; "
                                      "a tenth of the JSON's size or less)")
    e.add_argument("--chrome", help="output .json or .json.gz: trace-event JSON (all ranks, "
                                    "for Perfetto / chrome://tracing, with every event's args)")
    e.add_argument("--hta", help="output directory: one file per rank for HTA")
    e.add_argument("--ranks", help="only these emulated ranks, e.g. 0-7,16 (default: all)")
    e.add_argument("--iterations", help="only these iterations, e.g. 1 or 1-2 (default: all)")
    e.add_argument("--window", help="only events overlapping START:END, emulated ms")
    c = sub.add_parser("compare", help="speedup and per-op differences of run B over run A")
    c.add_argument("--json", action="store_true", help="JSON instead of tables")
    c.add_argument("--allow-incomplete", action="store_true",
                   help="analyse what is sound in a damaged run (notes on stderr)")
    c.add_argument("a", help="the baseline run directory")
    c.add_argument("b", help="the run directory compared with it")
    c.add_argument("--top", type=int, default=None,
                   help="ops listed (20 unless given; -1: all; --json: all unless given)")
    pl = sub.add_parser("plot", help="Gantt PNG of a run")
    pl.add_argument("--allow-incomplete", action="store_true",
                   help="analyse what is sound in a damaged run (notes on stderr)")
    pl.add_argument("run_dir", help="a run directory (runs/<name>, or --out of mpiemu run)")
    pl.add_argument("--out", help="PNG path (default RUN_DIR/timeline.png)")
    pl.add_argument("--t-min", type=float, help="start of the window (emulated ms)")
    pl.add_argument("--t-max", type=float, help="end of the window (emulated ms)")
    pl.add_argument("--ranks", type=int, nargs="+", help="only these ranks (default: all)")
    cal = sub.add_parser("calibrate", help="measure this host as a device preset")
    cal.add_argument("--out", default="host.toml", help="preset file to write")
    rep = sub.add_parser("report", help="regenerate a study under results/ (--list to see them)")
    rep.add_argument("name", nargs="?", help="the study (mpiemu report --list)")
    rep.add_argument("--list", action="store_true", help="list the studies and their seeds")
    rep.add_argument("--all", action="store_true", help="regenerate every study")
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
        from .config.errors import one_line  # noqa: PLC0415
        sys.stderr.write(f"mpiemu {args.command}: error: {one_line(exc)}\n")
        return 2
    except BrokenPipeError:             # `mpiemu ... | head`: the reader left
        import os  # noqa: PLC0415
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except ImportError as exc:          # an optional dependency: say which, and how
        extra = {"matplotlib": " (or pip install 'mpiemu[plot]')",
                 "perfetto": " (or pip install 'mpiemu[perfetto]')"}.get(exc.name or "", "")
        sys.stderr.write(f"mpiemu {args.command}: error: needs {exc.name or exc}: pip "
                         f"install {exc.name or '...'}{extra}\n")
        return 2


def entry() -> None:
    """The `mpiemu` command: `main`, and after an MPI run an end of the process that skips
    the interpreter's teardown.

    A rank that returned has closed its traces, written its share of the manifest and
    flushed; tearing the interpreter down (every module of numpy, h5py and mpiemu) would
    only add about 50 ms of CPU per rank, an eighth of an 8-rank timing-only run on two
    cores. So: Python's exit handlers, stdio, MPI_Finalize (mpi4py leaves it to the
    teardown), then the C library's `exit`, which still runs the C libraries' own exit
    handlers (MPICH's: without them the launcher takes the rank for dead and kills the
    ranks still finishing). Elsewhere, or if that fails, an ordinary exit. A `run`'s ranks
    collect garbage at iteration ends, not on allocation counts (`_proc.manual_gc`; the
    other commands, and tests calling `main` in-process, keep Python's policy)."""
    if sys.argv[1:2] == ["run"]:
        manual_gc()
    rc = main()
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        raise SystemExit(rc)
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    mpi.Finalize()
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        raise SystemExit(rc) from None
    libc.exit(rc)


if __name__ == "__main__":
    entry()

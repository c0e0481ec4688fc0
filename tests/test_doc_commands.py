"""Every command in the README's and the docs' shell blocks runs as pasted after `make run`:
it uses the venv's tools, names an existing subcommand, workload, study or preset, and its
`--set` keys load; the cheap ones are run."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest

from mpiemu.cli import COMMANDS
from mpiemu.config.errors import ConfigError
from mpiemu.config.workload import load_workload
from tests.conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def commands() -> list[tuple[str, str]]:
    """(page, command) for each command line of each ```sh block (continuations joined,
    comments dropped; lines of a shell loop that use its variables are left out)."""
    out = []
    for page in PAGES:
        for block in re.findall(r"```(?:sh|bash|shell)\n(.*?)```", page.read_text(), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.split(" #")[0].strip()
                if line and not line.startswith("#") and "$" not in line and \
                        not line.startswith(("for ", "do", "done")):
                    out.append((page.name, line))
    return out


CASES = commands()


def test_the_pages_have_commands() -> None:
    assert len(CASES) > 20


def _mpiemu_args(words: list[str]) -> list[str] | None:
    """The arguments after the mpiemu program in a command (None: not an mpiemu command)."""
    for i, w in enumerate(words):
        if w.endswith("bin/mpiemu") or w == "mpiemu":
            assert w == ".venv/bin/mpiemu", f"runs a bare `{w}`: use .venv/bin/mpiemu"
            return words[i + 1:]
        if w == "-m" and i + 1 < len(words) and words[i + 1] == "mpiemu":
            return words[i + 2:]
    return None


@pytest.mark.parametrize("page, line", CASES, ids=[f"{p}:{c[:50]}" for p, c in CASES])
def test_a_documented_command_names_what_exists(page: str, line: str) -> None:
    words = shlex.split(line)
    assert words[0] not in ("mpiexec", "python", "python3", "pytest"), \
        f"{page}: `{line}` runs a bare {words[0]}: use .venv/bin/{words[0]}"
    args = _mpiemu_args(words)
    if args is None:
        return
    assert args and args[0] in COMMANDS, f"{page}: unknown subcommand in `{line}`"
    if args[0] == "run":
        sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
        try:
            load_workload(str(ROOT / args[1]), sets)
        except ConfigError as exc:
            pytest.fail(f"{page}: `{line}`: {exc}")
    if args[0] == "report" and len(args) > 1 and not args[1].startswith("-"):
        from mpiemu.studies import STUDIES
        assert args[1] in STUDIES, f"{page}: no study {args[1]!r}"


@pytest.mark.parametrize("line", sorted({c for _, c in CASES
                                         if re.fullmatch(r"\.venv/bin/mpiemu (devices|report "
                                                         r"--list)( .*)?", c)}))
def test_the_cheap_documented_commands_run(line: str) -> None:
    words = shlex.split(line)
    res = subprocess.run([sys.executable, "-m", "mpiemu", *words[1:]], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-500:]


def _run_dir(args: list[str]) -> str:
    """Where `mpiemu run ARGS` writes: --out, or runs/<workload name>."""
    if "--out" in args:
        return args[args.index("--out") + 1]
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    return f"runs/{load_workload(str(ROOT / args[1]), sets).name}"


def test_no_documented_run_replaces_another() -> None:
    """`mpiemu run` refuses a directory that holds a run: a page's commands pasted in order
    after `make run` (which writes runs/quickstart) never run into a directory that
    `make run` or an earlier command of the page wrote, unless they say --force."""
    written: dict[str, str] = {}
    clashes = []
    for page, line in CASES:
        if page not in {w.split(":")[0] for w in written.values()}:
            written = {"runs/quickstart": f"{page}: make run"}
        args = _mpiemu_args(shlex.split(line))
        if not args or args[0] != "run" or "--force" in args:
            continue
        where = _run_dir(args)
        if where in written:
            clashes.append(f"{page}: `{line}` writes {where}, as {written[where]}")
        written[where] = f"{page}: `{line}`"
    assert not clashes, "\n".join(clashes)

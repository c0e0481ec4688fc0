"""Shell completion for `mpiemu`, generated from its own argument parser (bash and zsh's
bashcompinit): subcommands, each one's options, bundled workload names after `run`, study
names after `report`. `eval "$(.venv/bin/mpiemu completion)"` in a shell turns it on."""
from __future__ import annotations

import argparse


def _subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in p._actions:                         # argparse keeps them here only
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def bash_script(p: argparse.ArgumentParser) -> str:
    """A bash completion function for the parser's command (`complete -F`)."""
    from .studies import STUDIES  # noqa: PLC0415
    from .workloads import bundled  # noqa: PLC0415
    subs = _subparsers(p)
    cases = []
    for name, sp in subs.items():
        opts = sorted(o for a in sp._actions for o in a.option_strings)
        words = opts + ([f.stem for f in bundled()] if name == "run" else []) + \
            (sorted(STUDIES) if name == "report" else [])
        cases.append(f'    {name}) words="{" ".join(words)}" ;;')
    return "\n".join([
        "_mpiemu() {",
        '  local cur="${COMP_WORDS[COMP_CWORD]}" words',
        "  if [ \"$COMP_CWORD\" -eq 1 ]; then",
        f'    COMPREPLY=($(compgen -W "{" ".join(subs)}" -- "$cur")); return',
        "  fi",
        '  case "${COMP_WORDS[1]}" in',
        *cases,
        '    *) words="" ;;',
        "  esac",
        '  COMPREPLY=($(compgen -W "$words" -- "$cur") $(compgen -f -- "$cur"))',
        "}",
        "complete -F _mpiemu mpiemu",
        ""])

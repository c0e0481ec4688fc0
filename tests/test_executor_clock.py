"""Only executors move the critical-path cursor: no assignment to `.t` / `._t` (the
executor's clock) anywhere in `mpiemu/` outside `mpiemu/executors/`, and the cursor cannot
be assigned from outside (a read-only property)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from mpiemu.executors.gpu import GpuExecutor

PKG = Path(__file__).resolve().parents[1] / "mpiemu"
CLOCK = {"t", "_t"}


def clock_assignments(tree: ast.AST) -> list[int]:
    """Lines that assign (=, +=, a tuple target) to an attribute named t or _t."""
    lines = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for tgt in targets:
            for sub in ast.walk(tgt):
                if isinstance(sub, ast.Attribute) and sub.attr in CLOCK:
                    lines.append(node.lineno)
    return lines


def test_nothing_outside_executors_assigns_the_clock() -> None:
    found = [f"{p.relative_to(PKG.parent)}:{n}" for p in sorted(PKG.rglob("*.py"))
             if "executors" not in p.relative_to(PKG).parts
             for n in clock_assignments(ast.parse(p.read_text()))]
    assert found == [], f"the executor's clock assigned outside executors/: {found}"


@pytest.mark.parametrize("code, found", [("E.t = 3", 1), ("E.t, x = 1, 2", 1),
                                          ("E._t += 1", 1), ("x = E.t", 0)])
def test_the_check_sees_assignments(code: str, found: int) -> None:
    assert len(clock_assignments(ast.parse(code))) == found


def test_the_cursor_is_read_only() -> None:
    assert isinstance(GpuExecutor.t, property) and GpuExecutor.t.fset is None

"""User-facing errors: one line naming the field, the value and what is allowed."""
from __future__ import annotations

from typing import Any, Iterable


class ConfigError(ValueError):
    """Bad input in a workload, an override or a preset."""

    def __init__(self, field: str, value: Any, allowed: str | Iterable[Any]) -> None:
        if not isinstance(allowed, str):
            allowed = "choose one of " + ", ".join(repr(a) for a in allowed)
        self.field, self.value, self.allowed = field, value, allowed
        super().__init__(f"{field}={value!r}: {allowed}")


def one_line(exc: BaseException) -> str:
    """An exception as a single line (no traceback)."""
    text = str(exc) or type(exc).__name__
    return " ".join(text.split())

"""SHA-256 from CPython's built-in module where it has one.

`hashlib.sha256` is OpenSSL's: importing it maps libcrypto, about 4 MB of resident memory
in every rank, which a run with thousands of emulated GPUs on one host pays 64 times over
(issue 12's memory target). The built-in module computes the same digest.
"""
from __future__ import annotations

from typing import Any


def sha256(data: bytes = b"") -> Any:
    """A SHA-256 hash object (`update`, `hexdigest`), as `hashlib.sha256(data)`."""
    try:
        from _sha2 import sha256 as make  # type: ignore[import-not-found]  # Python >= 3.12
    except ImportError:
        try:
            from _sha256 import sha256 as make  # type: ignore[import-not-found,no-redef]
        except ImportError:                      # a build without them
            from hashlib import sha256 as make  # type: ignore[assignment]
    return make(data)


def sha256_hex(data: bytes) -> str:
    return str(sha256(data).hexdigest())

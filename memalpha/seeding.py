"""Stable seeds: one 31-bit integer from any parts, the same in every process and on every machine.

Python's ``hash`` of a string changes from process to process, so seeds that must agree
between ranks, or between a run and its resumed continuation, are derived here from a
SHA-256 of the parts instead. This module imports nothing of memalpha: every layer may use it.
"""

from __future__ import annotations

import hashlib
from typing import Any


def stable_seed(*parts: Any) -> int:
    """A 31-bit seed from ``parts`` (their ``str`` joined), independent of hash randomisation."""
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF

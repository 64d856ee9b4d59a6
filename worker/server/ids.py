"""Cheap unique ids for requests and completions: a random per-process prefix and a counter (uuid4 reads
the OS random source every time, which shows on the request path)."""

from __future__ import annotations

import itertools
import os

_PREFIX = os.urandom(8).hex()
_counter = itertools.count()


def new_id() -> str:
    """32 hex characters, unique within the process and, with overwhelming probability, across processes."""
    return f"{_PREFIX}{next(_counter):016x}"

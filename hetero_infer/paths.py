"""Where hetero-infer keeps what it builds or converts once per machine (converted models, the CPU kernel
library, the CPU kernel choices): HETERO_INFER_CACHE, else $XDG_CACHE_HOME/hetero-infer (~/.cache/hetero-infer).
Imports nothing heavy, so the loader and the kernels can share it."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    root = os.environ.get("HETERO_INFER_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "hetero-infer"
    )
    return Path(root)

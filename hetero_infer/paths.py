"""Where hetero-infer keeps what it builds or converts once per machine (the CPU kernel library, the CPU kernel
choices): HETERO_INFER_CACHE, else $XDG_CACHE_HOME/hetero-infer (~/.cache/hetero-infer); and where it keeps
models it downloads (s3://) or converts (GGUF): HETERO_INFER_MODEL_CACHE, else the `models` folder there, so a
cluster can share models on one volume while each pod builds kernels for its own CPU.
Imports nothing heavy, so the loader and the kernels can share it."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    root = os.environ.get("HETERO_INFER_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "hetero-infer"
    )
    return Path(root)


def model_cache_dir() -> Path:
    models = os.environ.get("HETERO_INFER_MODEL_CACHE")
    return Path(models).expanduser() if models else cache_dir() / "models"

"""Puts this folder on sys.path (pytest's default import mode adds a conftest's folder): the test folders share
`cli_process.py` (tests/server/server_proc.py and tests/router/router_proc.py build on it)."""

import os
import sys

import pytest


@pytest.fixture(autouse=True)
def _kernel_backend_unchanged():
    """A test that forces the kernels' backend (`kernels.set_backend`) and leaves it so would run every later test
    of the process through Triton's interpreter (minutes per model forward): fail the test that leaked it."""
    backend = sys.modules.get("hetero_infer.kernels._backend")
    # not imported yet: it will start from the environment's choice
    before = backend.get_backend() if backend else (os.environ.get("HETERO_INFER_KERNELS") or "auto").strip().lower()
    yield
    backend = sys.modules.get("hetero_infer.kernels._backend")
    if backend is not None and backend.get_backend() != before:
        leaked = backend.get_backend()
        backend.set_backend(before)
        pytest.fail(f"the test left the kernels' backend at {leaked!r} (was {before!r}): use kernels.use_backend")


@pytest.fixture(autouse=True)
def _project_environment_unchanged():
    """A test that sets a HETERO_INFER_* variable and leaves it (os.environ written directly, or monkeypatch.delenv
    of an absent variable followed by code that sets it) changes every later test of the process: fail it."""
    before = {k: v for k, v in os.environ.items() if k.startswith("HETERO_INFER_")}
    yield
    after = {k: v for k, v in os.environ.items() if k.startswith("HETERO_INFER_")}
    if after != before:
        for k in after.keys() - before.keys():
            del os.environ[k]
        os.environ.update(before)
        changed = sorted(k for k in after.keys() | before.keys() if after.get(k) != before.get(k))
        pytest.fail(f"the test left the environment changed: {', '.join(changed)} (use monkeypatch.setenv)")

"""The kind end-to-end suite (`pytest e2e`): runs e2e/run.sh where Docker and kind exist.

Not collected by the default `pytest` run (testpaths = tests). On a machine without a Docker
daemon, kind, kubectl or helm it skips and says which one is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "run.sh"
TIMEOUT_S = int(os.environ.get("E2E_TIMEOUT_S", "3600"))


def missing_prerequisite() -> str | None:
    """Why the suite cannot run here, or None when it can."""
    for env, name in (("DOCKER", "docker"), ("KIND", "kind"), ("KUBECTL", "kubectl"), ("HELM", "helm")):
        binary = os.environ.get(env, name)
        if shutil.which(binary) is None:
            return f"{name} is not installed (or ${env} does not point to it); the kind e2e suite needs it"
    docker = os.environ.get("DOCKER", "docker")
    try:
        info = subprocess.run([docker, "info"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"`{docker} info` failed ({e}); the kind e2e suite needs a running Docker daemon"
    if info.returncode != 0:
        first = (info.stderr.strip().splitlines() or ["no output"])[-1]
        return f"the Docker daemon is not reachable ({first}); the kind e2e suite needs one"
    return None


@pytest.mark.e2e
def test_kind_end_to_end() -> None:
    reason = missing_prerequisite()
    if reason:
        pytest.skip(reason)
    # The local Hub (e2e/local_hub.py) runs on this interpreter, which has the project's dev dependencies.
    env = {**os.environ, "PYTHON": os.environ.get("PYTHON", sys.executable)}
    proc = subprocess.run(["bash", str(SCRIPT)], timeout=TIMEOUT_S, env=env)
    assert proc.returncode == 0, f"{SCRIPT} failed with exit code {proc.returncode} (its output is above)"

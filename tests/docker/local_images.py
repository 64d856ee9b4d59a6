"""What the Dockerfiles need on a machine without an image registry, and the builds themselves.

No registry is reachable here, so `FROM python:...` / `FROM nvidia/cuda:...` cannot be pulled and
download.pytorch.org is not there either. This module makes the stand-ins that the build arguments
accept (docker/*.Dockerfile keep PYTHON_IMAGE, CUDA_IMAGE and TORCH_INDEX for mirrors and air-gapped
clusters):

- a Debian bookworm base image with python3, venv and pip, made with debootstrap and `docker import`
  (the machine's CA bundle goes in, so package downloads through a TLS-terminating proxy work);
- a PEP 503 "simple" index of torch and its dependencies, served on 127.0.0.1 (builds and containers
  use the host network), from the wheels that pip's own configuration finds (the CPU torch wheel lies
  in pip's find-links folder on these machines).

The docker suite (tests/docker/test_images_docker.py) uses it; by hand, as root:

    python tests/docker/local_images.py base                # prints the base image's name
    python tests/docker/local_images.py serve-index         # serves the torch index until Ctrl-C
    DOCKER_BUILDKIT=0 docker build --network host -f docker/worker-cpu.Dockerfile \\
        --build-arg PYTHON_IMAGE=hetero-infer-local/bookworm-python:1 \\
        --build-arg TORCH_INDEX=http://127.0.0.1:38765/ -t hetero-infer/worker:0.1.0-cpu .
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BASE_IMAGE = "hetero-infer-local/bookworm-python:1"
BASE_PACKAGES = "python3,python3-venv,python3-pip,python-is-python3,ca-certificates"
TORCH_VERSION = "2.13.0"  # what the project is tested with (README, CI)
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
CACHE = Path(os.environ.get("HETERO_INFER_DOCKER_CACHE", Path.home() / ".cache" / "hetero-infer-docker"))


def docker_unavailable() -> str | None:
    """Why Docker cannot be used here, or None when a daemon answers."""
    if shutil.which("docker") is None:
        return "no docker client on PATH"
    proc = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"],
                          capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        return f"no Docker daemon answers `docker info`: {(proc.stderr or proc.stdout).strip()[:300]}"
    return None


def image_exists(name: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", name], capture_output=True).returncode == 0


def apt_mirror() -> str:
    """The Debian mirror apt already uses (deb822 .sources files or a classic sources.list)."""
    files = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in files:
        if not path.is_file() or path.suffix not in ("", ".list", ".sources"):
            continue
        text = path.read_text(errors="replace")
        for url in re.findall(r"^URIs:\s*(\S+)", text, re.M) + re.findall(r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)", text, re.M):
            if "security" not in url and "/debian" in url:
                return url
    return "http://deb.debian.org/debian"


def make_base_image(name: str = BASE_IMAGE, suite: str = "bookworm") -> str:
    """A minimal Debian image with python3, venv and pip, as `docker import`ed `name` (kept if present)."""
    if image_exists(name):
        return name
    if shutil.which("debootstrap") is None:
        raise RuntimeError("debootstrap is missing: apt-get install -y debootstrap")
    with tempfile.TemporaryDirectory(prefix="hetero-infer-rootfs-", dir="/var/tmp") as tmp:
        rootfs = Path(tmp) / "rootfs"
        subprocess.run(["debootstrap", "--variant=minbase", f"--include={BASE_PACKAGES}", suite, str(rootfs),
                        apt_mirror()], check=True, stdout=subprocess.DEVNULL)
        if CA_BUNDLE.is_file():  # downloads in the build may go through a TLS-terminating proxy
            shutil.copyfile(CA_BUNDLE, rootfs / "etc/ssl/certs/ca-certificates.crt")
        shutil.rmtree(rootfs / "var/cache/apt/archives", ignore_errors=True)
        (rootfs / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        subprocess.run(["docker", "import", "--change", 'CMD ["python3"]', "-", name], stdin=tar.stdout,
                       check=True, stdout=subprocess.DEVNULL)
        if tar.wait() != 0:
            raise RuntimeError("tar of the debootstrap root failed")
    return name


def _project(filename: str) -> str:
    """PEP 503 normalized project name of a wheel or sdist file name."""
    stem = filename.split("-")[0] if filename.endswith(".whl") else filename.rsplit("-", 1)[0]
    return re.sub(r"[-_.]+", "-", stem).lower()


def make_torch_index(folder: Path = CACHE / "torch-index", version: str = TORCH_VERSION) -> Path:
    """A simple index (one folder per project) of torch==version and its dependencies.

    pip resolves them with its own configuration: on these machines that takes the CPU wheel from the
    find-links folder and the dependencies from PyPI, for this interpreter (the base image's Python,
    3.11 on bookworm, is the same minor version)."""
    marker = folder / f".torch-{version}"
    if marker.is_file():
        return folder
    wheels = folder.with_name(folder.name + "-wheels")
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--dest",
                    str(wheels), f"torch=={version}"], check=True)
    for wheel in wheels.iterdir():
        target = folder / _project(wheel.name) / wheel.name
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            os.link(wheel, target)
    marker.touch()
    return folder


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass


INDEX_PORT = 38765  # a fixed URL keeps TORCH_INDEX, and so docker's layer cache, the same between runs


@contextmanager
def serve_index(folder: Path, port: int = INDEX_PORT) -> Iterator[str]:
    """Serve `folder` on 127.0.0.1 (its directory listings are valid simple-index pages); yields the URL.
    Where `port` is taken, any free one (the builds then miss the cache of the torch step)."""
    handler = functools.partial(_QuietHandler, directory=str(folder))
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    except OSError:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class Build:
    tag: str
    seconds: float
    log: str


def build_context() -> Path:
    """The repository root, or HETERO_INFER_DOCKER_CONTEXT: a copy of it, e.g. a committed snapshot
    (`git archive HEAD | tar -x -C DIR`) while the working tree is being edited."""
    return Path(os.environ.get("HETERO_INFER_DOCKER_CONTEXT") or ROOT)


def build(dockerfile: str, tag: str, build_args: dict[str, str], timeout: float = 3600) -> Build:
    """`docker build` of docker/<dockerfile> in build_context() (legacy builder: BuildKit would pull the
    `# syntax=` frontend image); raises with the log's tail when it fails."""
    context = build_context()
    cmd = ["docker", "build", "--network", "host", "-f", str(context / "docker" / dockerfile), "-t", tag]
    for key, value in build_args.items():
        cmd += ["--build-arg", f"{key}={value}"]
    start = time.monotonic()
    proc = subprocess.run([*cmd, str(context)], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "DOCKER_BUILDKIT": "0"})
    seconds = time.monotonic() - start
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"docker build -f docker/{dockerfile} failed after {seconds:.0f} s:\n{log[-6000:]}")
    return Build(tag, seconds, log)


def image_size(tag: str) -> int:
    out = subprocess.run(["docker", "image", "inspect", "--format", "{{.Size}}", tag],
                         capture_output=True, text=True, check=True).stdout
    return int(out.strip())


def main(argv: list[str]) -> int:
    if argv[:1] == ["base"]:
        print(make_base_image())
    elif argv[:1] == ["index"]:
        print(make_torch_index())
    elif argv[:1] == ["serve-index"]:
        port = int(argv[1]) if len(argv) > 1 else INDEX_PORT
        with serve_index(make_torch_index(), port) as url:
            print(f"TORCH_INDEX={url} (Ctrl-C stops it)", flush=True)
            try:
                threading.Event().wait()
            except KeyboardInterrupt:
                pass
    else:
        print("usage: local_images.py base | index | serve-index [PORT]", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

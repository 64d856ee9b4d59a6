"""Running the suite's containers: `docker run` of an image or of a pod's container as the operator renders it,
readiness, metrics, logs and SIGTERM (tests/docker/test_*_docker.py and test_router_image.py)."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import textwrap
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

from prometheus_client.parser import text_string_to_metric_families


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def docker(*args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=check)


def unique_name(kind: str = "") -> str:
    return f"hetero-infer-docker-suite-{kind + '-' if kind else ''}{uuid.uuid4().hex[:8]}"


@contextlib.contextmanager
def container(image: str, *args: str, options: tuple[str, ...] = (), network: str = "host",
              name: str | None = None) -> Iterator[str]:
    """`docker run -d --network NETWORK` (no --rm: the exit code is read after it stops); removed at the end,
    with its log attached to a failure."""
    name = name or unique_name()
    docker("run", "-d", "--name", name, "--network", network, *options, image, *args)
    try:
        yield name
    except BaseException:
        print(f"--- log of {name}:\n{logs(name)[-8000:]}")
        raise
    finally:
        docker("rm", "-f", name, check=False)


@contextlib.contextmanager
def network() -> Iterator[str]:
    """A user-defined bridge network: its containers reach each other by container name."""
    name = unique_name("net")
    docker("network", "create", name)
    try:
        yield name
    finally:
        docker("network", "rm", name, check=False)


def pod_run_options(pod: dict[str, Any], spec: dict[str, Any], *, user: bool = True,
                    shared: dict[str, str] | None = None) -> list[str]:
    """`docker run` options for container `spec` of pod spec `pod`, as kubelet would run it: the pod's user
    (unless `user` is False: then the image's), the container's securityContext, its emptyDirs as tmpfs (not
    noexec: kernels may be built there) except the volumes `shared` maps to a host folder (a volume an init
    container fills for the next), its env and its command as the entrypoint."""
    shared = shared or {}
    options: list[str] = []
    if user:
        options += ["--user", f"{pod['securityContext']['runAsUser']}:{pod['securityContext']['runAsGroup']}"]
    security = spec.get("securityContext", {})
    if security.get("readOnlyRootFilesystem"):
        options.append("--read-only")
    for cap in security.get("capabilities", {}).get("drop", []):
        options += ["--cap-drop", cap]
    if security.get("allowPrivilegeEscalation") is False:
        options += ["--security-opt", "no-new-privileges"]
    for mount in spec.get("volumeMounts", []):
        if mount["name"] in shared:
            options += ["-v", f"{shared[mount['name']]}:{mount['mountPath']}"]
        else:
            options += ["--tmpfs", f"{mount['mountPath']}:rw,exec,mode=1777"]
    for env in spec.get("env", []):
        options += ["-e", f"{env['name']}={env['value']}"]
    return [*options, "--entrypoint", spec["command"][0]]


def running(name: str) -> bool:
    return docker("inspect", "--format", "{{.State.Running}}", name, check=False).stdout.strip() == "true"


def logs(name: str) -> str:
    proc = docker("logs", name, check=False)
    return proc.stdout + proc.stderr


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as rsp:
        return json.loads(rsp.read())


def wait_ready(name: str, base: str, deadline_s: float) -> float:
    """Seconds until GET /readyz answers 200; fails at the deadline or when the container exits."""
    return wait_for(name, lambda: _ready(base), deadline_s, f"{base}/readyz 200")


def wait_for(name: str, condition: Any, deadline_s: float, what: str) -> float:
    """Seconds until condition() is true (connection errors count as false); fails at the deadline or when
    container `name` exits."""
    start = time.monotonic()
    while time.monotonic() - start < deadline_s:
        try:
            if condition():
                return time.monotonic() - start
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        assert running(name), f"{name} exited before {what}:\n{logs(name)[-4000:]}"
        time.sleep(0.5)
    raise AssertionError(f"not {what} within {deadline_s:.0f} s:\n{logs(name)[-4000:]}")


def _ready(base: str) -> bool:
    with urllib.request.urlopen(f"{base}/readyz", timeout=5) as rsp:
        return rsp.status == 200


def metric_families(base: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as rsp:
        return {f.name: f for f in text_string_to_metric_families(rsp.read().decode())}


def stop(name: str, timeout: float = 660) -> int:
    """SIGTERM, then the exit code once the process has ended."""
    docker("kill", "--signal", "TERM", name)
    return int(docker("wait", name, timeout=timeout).stdout.strip())


def run_python(image: str, code: str, *options: str) -> subprocess.CompletedProcess:
    return docker("run", "--rm", "--network", "host", *options, "--entrypoint", "python", image, "-c",
                  textwrap.dedent(code), check=False, timeout=600)

"""Fixtures of the docker suite: a daemon or a skip that says why, the stand-ins for the build arguments
(tests/docker/local_images.py), the three images built once per session, and a KMock API server."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import local_images as li
import pytest

OPERATOR_TESTS = Path(__file__).resolve().parents[1] / "operator"
for _helpers in ("sources", "quant"):  # the local Hub (hub_server) and the tiny model (quant_testing)
    if str(OPERATOR_TESTS.parent / _helpers) not in sys.path:
        sys.path.append(str(OPERATOR_TESTS.parent / _helpers))
BUILDS: list[tuple[str, li.Build, int]] = []  # (Dockerfile, build, image size): printed at the end


@pytest.fixture(scope="session")
def docker() -> None:
    reason = li.docker_unavailable()
    if reason:
        pytest.skip(f"the docker suite needs a Docker daemon: {reason}")


@pytest.fixture(scope="session")
def base_image(docker: None) -> str:
    return li.make_base_image()


@pytest.fixture(scope="session")
def torch_index(docker: None) -> Iterator[str]:
    with li.serve_index(li.make_torch_index()) as url:
        yield url


def _build(dockerfile: str, tag: str, args: dict[str, str]) -> str:
    result = li.build(dockerfile, tag, args)
    BUILDS.append((dockerfile, result, li.image_size(tag)))
    return tag


@pytest.fixture(scope="session")
def worker_cpu_image(base_image: str, torch_index: str) -> str:
    return _build("worker-cpu.Dockerfile", "hetero-infer/worker:docker-suite-cpu",
                  {"PYTHON_IMAGE": base_image, "TORCH_INDEX": torch_index})


@pytest.fixture(scope="session")
def operator_image(base_image: str) -> str:
    return _build("operator.Dockerfile", "hetero-infer/operator:docker-suite", {"PYTHON_IMAGE": base_image})


@pytest.fixture(scope="session")
def cuda_standin_image(base_image: str, torch_index: str) -> str:
    """worker.Dockerfile on the Debian base instead of nvidia/cuda, with the CPU torch wheel: every build
    step runs; only what needs a GPU cannot be checked here."""
    return _build("worker.Dockerfile", "hetero-infer/worker:docker-suite-cuda-standin",
                  {"CUDA_IMAGE": base_image, "TORCH_INDEX": torch_index})


@pytest.fixture
def kmock_options() -> dict[str, Any]:
    """The KMock server of tests/operator (API server defaults, resourceVersions, selectors, ...)."""
    if str(OPERATOR_TESTS) not in sys.path:
        sys.path.append(str(OPERATOR_TESTS))
    from kmock_cluster import ClusterEmulator

    return {"cls": ClusterEmulator}


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if BUILDS:
        terminalreporter.section("docker builds")
        for dockerfile, result, size in BUILDS:
            terminalreporter.write_line(f"{dockerfile}: {result.seconds:.0f} s, {size / 1e6:.0f} MB ({result.tag})")

"""Kernel tests: the Triton kernels against the PyTorch references and naive float64 oracles.

Without a GPU the Triton kernels run in Triton's CPU interpreter: TRITON_INTERPRET=1 must
be in the environment before the kernel modules are imported (``triton.jit`` reads it
at decoration time). hetero_infer.kernels imports them lazily, so setting it here, at
collection time, is early enough.

Every test that takes the ``device`` fixture runs twice: on the default device (the CPU
interpreter here; CUDA on a machine with one) and on ``cuda``, the second marked ``gpu``, so
``pytest -m gpu`` runs every kernel case on CUDA: the small default shapes (sliding window,
split-KV, tile configs, zero-length rows, int64 block tables, varlen, quantized split-K...) as
well as the large, gpu-marked ones. A gpu-marked case runs once under ``-m gpu``, on ``cuda``.
Without a CUDA device the ``cuda`` cases are skipped (they are deselected by default anyway).
"""

from __future__ import annotations

import os
import re
import zlib

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from hetero_infer import kernels  # noqa: E402

DEFAULT_DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
CUDA = torch.device("cuda")
DEVICE_PARAMS = [pytest.param(DEFAULT_DEVICE, id="default"), pytest.param(CUDA, id="cuda", marks=pytest.mark.gpu)]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "device" in metafunc.fixturenames:
        metafunc.parametrize("device", DEVICE_PARAMS)


def _here(item: pytest.Item) -> bool:
    return str(item.fspath).startswith(os.path.dirname(__file__))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A gpu-marked case (a large shape) on the default device would run a second time under -m gpu:
    # it runs on `cuda` only.
    twice = [item for item in items if _here(item) and item.get_closest_marker("gpu")
             and getattr(item, "callspec", None) is not None and item.callspec.params.get("device") is DEFAULT_DEVICE]
    if twice:
        config.hook.pytest_deselected(items=twice)
        dropped = set(map(id, twice))
        items[:] = [item for item in items if id(item) not in dropped]
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (gpu-marked; deselected by default)")
    for item in items:
        if item.get_closest_marker("gpu") and _here(item):
            item.add_marker(skip)


@pytest.fixture
def triton_backend():
    """Force the Triton kernels (on the CPU through the interpreter)."""
    with kernels.use_backend("triton"):
        yield


@pytest.fixture(autouse=True)
def _seed(request):
    # fresh inputs per test, but reproducible from the test id; the same on both devices (the id without the
    # device part: the inputs a case had before it ran on two devices)
    nodeid = re.sub(r"\[(default|cuda)\]$", "", re.sub(r"\[(default|cuda)-", "[", request.node.nodeid))
    torch.manual_seed(zlib.crc32(nodeid.encode()))

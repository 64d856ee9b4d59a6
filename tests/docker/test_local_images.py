"""The docker suite's helpers (tests/docker/local_images.py), in the default suite: no daemon needed."""

from __future__ import annotations

from pathlib import Path

import local_images
import pytest


def test_without_a_daemon_the_reason_names_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/docker.sock")  # nothing listens there
    reason = local_images.docker_unavailable()
    assert reason is not None and "no Docker daemon" in reason


def test_without_a_client_the_reason_names_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert local_images.docker_unavailable() == "no docker client on PATH"


@pytest.mark.parametrize(("filename", "project"), [
    ("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl", "torch"),
    ("typing_extensions-4.16.0-py3-none-any.whl", "typing-extensions"),
    ("MarkupSafe-3.0.4-cp311-cp311-manylinux_2_17_x86_64.whl", "markupsafe"),
    ("zope.interface-7.0.tar.gz", "zope-interface"),
])
def test_index_folders_use_pep_503_names(filename: str, project: str) -> None:
    assert local_images._project(filename) == project


def test_the_index_is_served_as_pip_reads_it(tmp_path: Path) -> None:
    import urllib.request

    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"x")
    with local_images.serve_index(tmp_path, 0) as url:
        assert url.startswith("http://127.0.0.1:")
        page = urllib.request.urlopen(url + "torch/", timeout=10).read().decode()
    assert 'href="torch-2.13.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl"' in page

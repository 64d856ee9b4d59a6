"""spec.adapters with the real operator (kopf) against the API emulator: each hf:// or s3:// adapter downloaded by
its own Job into the model cache, listed to the workers (the ConfigMap they follow) once it is there, its phase in
status.adapters; adapters added and removed while the worker Deployment's pod template stays as it is: no rollout;
the field dropped: LoRA off, the list, the Jobs and the status entries gone. And where each adapter is served:
real worker servers (mock executor) following the ConfigMap's file, status.adapters[].loadedReplicas counting the
ready worker pods that serve it.

The emulator has no Job controller, no Deployment controller and no kubelet: the test completes or fails the Jobs,
keeps one pod per worker in the API (pointing at a real worker server in this process) and writes the ConfigMap's
file where each worker reads it, as they would."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kmock_cluster import CONFIG_MAPS, DEPLOYMENTS, INFD, JOBS, wait_for
from test_model_cache_kmock import COMPLETE, INFD_PATH, cached, job_name, job_status
from test_operator_kmock import NS, create, live, patch

from hetero_infer.operator import constants as c
from hetero_infer.operator.manifests import selector_labels

SQL = {"name": "sql", "url": "hf://org/sql-lora"}
CHAT = {"name": "chat", "url": "s3://adapters/chat"}
FAILED = {"failed": 7, "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}


def listed(kmock: Any) -> list[str] | None:
    cm = live(kmock, CONFIG_MAPS, "smol-adapters")
    return None if cm is None else [a["name"] for a in json.loads(cm["data"][c.ADAPTERS_KEY])]


def phases(kmock: Any) -> dict[str, str]:
    return {a["name"]: a["phase"] for a in ((live(kmock, INFD) or {}).get("status") or {}).get("adapters") or []}


async def test_adapters_come_and_go_without_a_rollout(kmock: Any, operator: Any) -> None:
    await operator("--resync-seconds", "0.2")
    await create(kmock, {**cached(), "spec": {**cached()["spec"], "adapters": [SQL]}})
    await wait_for(lambda: live(kmock, JOBS, job_name()), what="the model's download Job")
    await job_status(kmock, job_name(), COMPLETE)
    deployment = await wait_for(lambda: live(kmock, DEPLOYMENTS), what="the worker Deployment")
    pod = json.dumps(deployment["spec"]["template"], sort_keys=True)
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--enable-lora" in args and "--lora-modules-file" in args

    sql_job = await wait_for(lambda: live(kmock, JOBS, job_name(SQL["url"])), what="the adapter's download Job")
    (fetch,) = sql_job["spec"]["template"]["spec"]["containers"]
    assert fetch["command"][2] == SQL["url"] and "--adapter" in fetch["command"]
    await wait_for(lambda: listed(kmock) == [] and phases(kmock) == {"sql": "Pending"}, what="sql pending, unlisted")

    await job_status(kmock, job_name(SQL["url"]), COMPLETE)
    await wait_for(lambda: listed(kmock) == ["sql"] and phases(kmock) == {"sql": "Ready"}, what="sql listed")

    await patch(kmock, INFD_PATH, {"spec": {"adapters": [SQL, CHAT]}})
    await wait_for(lambda: live(kmock, JOBS, job_name(CHAT["url"])), what="chat's download Job")
    await wait_for(lambda: phases(kmock) == {"sql": "Ready", "chat": "Pending"}, what="chat pending")
    assert listed(kmock) == ["sql"]
    await job_status(kmock, job_name(CHAT["url"]), FAILED)
    await wait_for(lambda: phases(kmock).get("chat") == "Failed", what="chat failed")
    assert listed(kmock) == ["sql"]  # a failed adapter is not offered to the workers

    await patch(kmock, INFD_PATH, {"spec": {"adapters": [CHAT]}})
    await wait_for(lambda: listed(kmock) == [] and set(phases(kmock)) == {"chat"}, what="sql gone")
    await wait_for(lambda: live(kmock, JOBS, job_name(SQL["url"])) is None, what="sql's Job deleted")

    after = live(kmock, DEPLOYMENTS)
    assert json.dumps(after["spec"]["template"], sort_keys=True) == pod, "the adapters changed the pod template"
    assert after["metadata"].get("generation") == deployment["metadata"].get("generation")

    await patch(kmock, INFD_PATH, {"spec": {"adapters": None}})  # LoRA off: the list, the Jobs and the status go
    await wait_for(lambda: live(kmock, CONFIG_MAPS, "smol-adapters") is None, what="the ConfigMap deleted")
    await wait_for(lambda: live(kmock, JOBS, job_name(CHAT["url"])) is None, what="chat's Job deleted")
    await wait_for(lambda: "adapters" not in (live(kmock, INFD).get("status") or {}), what="status.adapters gone")
    assert "--enable-lora" not in live(kmock, DEPLOYMENTS)["spec"]["template"]["spec"]["containers"][0]["args"]


@pytest.fixture(scope="module")
def model_and_adapter(tmp_path_factory: Any) -> tuple[Path, Path]:
    tests = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(tests / "lora"))
    sys.path.insert(0, str(tests / "quant"))
    from lora_testing import save_adapter
    from quant_testing import save_tiny_model

    root = tmp_path_factory.mktemp("lora-operator")
    base = save_tiny_model("llama", root / "model")
    return root / "model", save_adapter(base, root / "sql", r=8, targets=["q_proj", "v_proj"], seed=1)


@contextlib.asynccontextmanager
async def lora_workers(folder: Path, files: list[Path]) -> AsyncIterator[list[int]]:
    """One real worker server per file (mock executor, LoRA on), each following its file as `--lora-modules-file`
    does; yields their ports."""
    from aiohttp.test_utils import TestServer

    from hetero_infer.contracts.engine_options import EngineConfig
    from hetero_infer.contracts.server_options import ServerOptions
    from hetero_infer.worker.core.engine import LLMEngine
    from hetero_infer.worker.server.app import create_app
    from hetero_infer.worker.server.lora import follow_modules_file
    from hetero_infer.worker.server.state import ServerState

    servers, clients, followers = [], [], []
    try:
        for path in files:
            engine = LLMEngine(EngineConfig(model=str(folder), served_model_name="tiny", executor="mock",
                                            enable_lora=True, max_loras=2, max_model_len=256, max_num_blocks=64))
            state = ServerState(ServerOptions(access_log=False))
            server = TestServer(create_app(state), host="127.0.0.1")
            await server.start_server()
            servers.append(server)
            clients.append(state.start_engine(engine, max_num_seqs=engine.config.max_num_seqs))
            followers.append(asyncio.ensure_future(follow_modules_file(state, str(path), interval_s=0.1)))
        yield [s.port for s in servers]
    finally:
        for f in followers:
            f.cancel()
        for client in clients:
            client.shutdown()
        for server in servers:
            await server.close()


def loaded(kmock: Any) -> dict[str, int | None]:
    return {a["name"]: a.get("loadedReplicas")
            for a in ((live(kmock, INFD) or {}).get("status") or {}).get("adapters") or []}


async def test_status_counts_the_ready_workers_that_serve_each_adapter(kmock: Any, operator: Any,
                                                                      model_and_adapter: Any, tmp_path: Path) -> None:
    folder, adapter = model_and_adapter
    files = [tmp_path / f"worker-{i}.json" for i in range(2)]
    async with lora_workers(folder, files) as ports:
        await operator("--resync-seconds", "0.2")
        await create(kmock, {**cached(), "spec": {**cached()["spec"], "adapters": [SQL]}})  # 2 replicas
        await wait_for(lambda: live(kmock, JOBS, job_name()), what="the model's download Job")
        await job_status(kmock, job_name(), COMPLETE)
        deployment = await wait_for(lambda: live(kmock, DEPLOYMENTS), what="the worker Deployment")
        await wait_for(lambda: loaded(kmock) == {"sql": 0}, what="sql pending, served nowhere")
        # the Deployment controller and the kubelet: two ready pods, each the address of a worker
        for i, port in enumerate(ports):
            rsp = await kmock.post(f"/api/v1/namespaces/{NS}/pods", json={
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"smol-{i}", "namespace": NS, "labels": selector_labels("smol")},
                "spec": {"containers": [{"name": "worker", "image": "w",
                                         "ports": [{"name": c.WORKER_PORT_NAME, "containerPort": port}]}]},
                "status": {"phase": "Running", "podIP": "127.0.0.1",
                           "conditions": [{"type": "Ready", "status": "True"}]}})
            assert rsp.status == 200, await rsp.text()
        await patch(kmock, f"/apis/apps/v1/namespaces/{NS}/deployments/smol/status", {"status": {
            "observedGeneration": deployment["metadata"]["generation"], "replicas": 2, "updatedReplicas": 2,
            "readyReplicas": 2, "availableReplicas": 2}})

        await job_status(kmock, job_name(SQL["url"]), COMPLETE)
        await wait_for(lambda: listed(kmock) == ["sql"], what="sql listed to the workers")
        assert loaded(kmock) == {"sql": 0}  # listed, not loaded yet: nobody wrote the workers' files
        # the kubelet mounts the ConfigMap: its file, at the adapter's folder here (the pods read the cache's path)
        listing = json.loads(live(kmock, CONFIG_MAPS, "smol-adapters")["data"][c.ADAPTERS_KEY])
        for path in files:
            path.write_text(json.dumps([{"name": a["name"], "path": str(adapter)} for a in listing]))
        await wait_for(lambda: loaded(kmock) == {"sql": 2}, timeout=60, what="sql served by both workers")
        assert phases(kmock) == {"sql": "Ready"}

        files[1].write_text("[]")  # one worker's copy of the list lags behind (or its load failed): sql unloaded
        await wait_for(lambda: loaded(kmock) == {"sql": 1}, timeout=60, what="sql served by one worker")
        await patch(kmock, INFD_PATH, {"spec": {"adapters": []}})
        await wait_for(lambda: loaded(kmock) == {}, what="no adapters in the status")
        await operator.stop()

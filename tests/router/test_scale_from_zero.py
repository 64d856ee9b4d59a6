"""Scale from zero through the operator, end to end: the real operator (kopf, `hetero-infer operator`'s handlers)
against the KMock API emulator, a `hetero-infer router` process discovering workers from the emulator's
EndpointSlices, and the test playing the Deployment controller and kubelet.

An InferenceDeployment with the router and `minReplicas: 0` starts at 0 replicas. A client's request reaches
the router, which holds it (no ready worker) and, started with `--scale-target` as the operator renders it,
sets the InferenceDeployment's scale to 1 itself; the Deployment follows; the test, seeing replicas 1, starts a mock-executor
worker process, publishes its Pod and a ready endpoint in the `<name>-workers` EndpointSlice; the router
discovers it and the held request is answered. With no further request, the operator scales back to 0 after
`scaleToZeroAfterSeconds`, and the test withdraws the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kmock as kmock_lib
import openai
import pytest

from hetero_infer.operator import constants as c
from hetero_infer.operator.manifests import selector_labels, workers_service_name

TESTS = Path(__file__).resolve().parents[1]
for folder in (TESTS / "operator", TESTS / "router"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from borrowed_fixtures import operator_fixtures  # noqa: E402
from kmock_cluster import DEPLOYMENTS, INFD, wait_for  # noqa: E402
from router_proc import Proc, samples  # noqa: E402

_operator_fixtures = operator_fixtures()
crd = _operator_fixtures.crd
kmock_options = _operator_fixtures.kmock_options
kubeconfig = _operator_fixtures.kubeconfig
operator = _operator_fixtures.operator

pytestmark = pytest.mark.slow  # a router and a worker process start (about half a minute on two loaded cores)

NS = "serving"
NAME = "smol"
MODEL = "mock-smollm2"
PODS = kmock_lib.resource("", "v1", "pods")
SLICES = f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"


def live(kmock: Any, resource: Any, name: str) -> dict[str, Any] | None:
    key = (resource, NS, name)
    if key not in kmock.objects or kmock.objects[key].deleted:
        return None
    return kmock.objects[key].raw


def pod(name: str, component: str, port: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "labels": selector_labels(NAME, component)},
            "spec": {"containers": [{"name": component, "image": "x",
                                     "ports": [{"name": "http", "containerPort": port}]}]},
            "status": {"phase": "Running", "podIP": "127.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]}}


def worker_slice(port: int | None) -> dict[str, Any]:
    """The EndpointSlice controller's view of `<name>-workers`: one ready endpoint per running worker."""
    endpoints = [] if port is None else [{"addresses": ["127.0.0.1"], "conditions": {"ready": True},
                                          "targetRef": {"kind": "Pod", "name": f"{NAME}-worker-0"}}]
    service = workers_service_name(NAME)
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"{service}-abcde", "namespace": NS,
                         "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4", "endpoints": endpoints,
            "ports": [{"name": "http", "port": port or c.WORKER_PORT, "protocol": "TCP"}]}


class Kubelet:
    """Plays the Deployment controller and kubelet for the worker Deployment: a mock worker process per replica
    (at most one here), its Pod and its endpoint in the worker Service's EndpointSlice."""

    def __init__(self, kmock: Any) -> None:
        self.kmock = kmock
        self.worker: Proc | None = None
        self.started = 0

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            dep = live(self.kmock, DEPLOYMENTS, NAME)
            want = int((dep or {}).get("spec", {}).get("replicas") or 0)
            if want >= 1 and self.worker is None:
                self.worker = await asyncio.to_thread(
                    Proc, "serve", "--port", "0", "--executor", "mock", "--no-engine-process",
                    "--served-model-name", MODEL, "--no-access-log")
                await asyncio.to_thread(self.worker.wait_ready)
                self.started += 1
                port = int(self.worker.url.rsplit(":", 1)[1])
                await self._post(f"/api/v1/namespaces/{NS}/pods", pod(f"{NAME}-worker-0", c.COMPONENT_WORKER, port))
                await self._patch_slice(port)
            elif want == 0 and self.worker is not None:
                await self._patch_slice(None)
                await self.kmock.delete(f"/api/v1/namespaces/{NS}/pods/{NAME}-worker-0")
                await asyncio.to_thread(self.worker.stop)
                self.worker = None
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.1)

    async def _post(self, path: str, body: dict[str, Any]) -> None:
        rsp = await self.kmock.post(path, json=body)
        assert rsp.status == 200, await rsp.text()

    async def _patch_slice(self, port: int | None) -> None:
        rsp = await self.kmock.patch(f"{SLICES}/{workers_service_name(NAME)}-abcde", json=worker_slice(port),
                                     headers={"Content-Type": "application/merge-patch+json"})
        assert rsp.status == 200, await rsp.text()

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.stop()


@pytest.fixture
async def cluster(kmock: Any, kubeconfig: Path) -> AsyncIterator[tuple[Any, Kubelet, Proc]]:
    kmock.resources[PODS] = kmock_lib.ResourceInfo(kind="Pod", singular="pod", namespaced=True,
                                                   verbs={"get", "list", "watch", "create", "patch", "delete"},
                                                   subresources={"status"})
    rsp = await kmock.post(SLICES, json=worker_slice(None))  # the worker Service exists, with no endpoint
    assert rsp.status == 200, await rsp.text()
    # The router pod: the process the router Deployment would run, with the arguments the operator renders.
    router = await asyncio.to_thread(Proc, "router", "--port", "0", "--discover-service", workers_service_name(NAME),
                                     "--namespace", NS, "--scale-target", NAME, "--health-interval-s", "0.2",
                                     "--hold-timeout-s", "300")
    await asyncio.to_thread(router.wait_ready)
    rsp = await kmock.post(f"/api/v1/namespaces/{NS}/pods",
                           json=pod(f"{NAME}-router-0", c.COMPONENT_ROUTER, int(router.url.rsplit(":", 1)[1])))
    assert rsp.status == 200, await rsp.text()
    kubelet = Kubelet(kmock)
    stop = asyncio.Event()
    task = asyncio.create_task(kubelet.run(stop))
    try:
        yield kmock, kubelet, router
    finally:
        stop.set()
        await task
        kubelet.stop()
        router.stop()


def spec_replicas(kmock: Any) -> int:
    return int((live(kmock, INFD, NAME) or {}).get("spec", {}).get("replicas") or 0)


async def test_a_held_request_scales_from_zero_is_answered_and_idle_scales_back_to_zero(cluster: Any,
                                                                                        operator: Any) -> None:
    kmock, kubelet, router = cluster
    await operator()
    body = {"apiVersion": c.API_VERSION, "kind": c.KIND, "metadata": {"name": NAME, "namespace": NS},
            "spec": {"model": {"name": MODEL}, "executor": "mock", "replicas": 0,
                     "router": {"enabled": True, "holdTimeoutSeconds": 300},
                     "autoscaling": {"enabled": True, "minReplicas": 0, "maxReplicas": 1, "intervalSeconds": 1,
                                     "scaleToZeroAfterSeconds": 3}}}
    rsp = await kmock.post(f"/apis/{c.API_VERSION}/namespaces/{NS}/{c.PLURAL}", json=body)
    assert rsp.status == 200, await rsp.text()
    await wait_for(lambda: live(kmock, DEPLOYMENTS, f"{NAME}-router"), what="the router Deployment")
    # Nothing asked for: it stays at zero, and no worker runs.
    await wait_for(lambda: any(cd["type"] == c.COND_SCALING_ACTIVE and cd["reason"] == "Idle"
                               for cd in (live(kmock, INFD, NAME) or {}).get("status", {}).get("conditions") or []),
                   timeout=30, what="the autoscaler's first pass at zero")
    assert spec_replicas(kmock) == 0 and kubelet.worker is None

    client = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    answer = asyncio.create_task(client.completions.create(model=MODEL, prompt="hello", max_tokens=3))
    await wait_for(lambda: samples(router.url, "hetero_infer_router_requests_held").get("", 0) >= 1,
                   timeout=30, what="the router holding the request")
    await wait_for(lambda: spec_replicas(kmock) == 1, timeout=60, what="the router scaling 0 -> 1")
    completion = await asyncio.wait_for(answer, 240)
    assert completion.choices[0].text and completion.model == MODEL
    assert kubelet.started == 1
    assert samples(router.url, "hetero_infer_router_held_requests_total").get("", 0) >= 1
    assert samples(router.url, "hetero_infer_router_requests_held").get("", 0) == 0
    # The router wrote the scale itself (its kubeconfig: the emulator's), not the operator's next pass.
    assert samples(router.url, "hetero_infer_router_scale_from_zero_total") == {"scaled": 1.0}

    # Idle for scaleToZeroAfterSeconds: back to zero, and the worker goes.
    await wait_for(lambda: spec_replicas(kmock) == 0, timeout=90, what="the operator scaling 1 -> 0 when idle")
    await wait_for(lambda: kubelet.worker is None, timeout=60, what="the worker withdrawn")
    await client.close()

"""The real operator (kopf) against KMock with spec.router: the router Deployment's availability flows into
status.router, RouterReady and Ready, and a converged status is not written again on resyncs."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from kmock_cluster import DEPLOYMENTS, INFD, wait_for
from test_kubectl import kubectl
from test_operator_kmock import NS, create, infd, live, patch

from hetero_infer.operator import constants as c

DEPLOYMENTS_PATH = f"/apis/apps/v1/namespaces/{NS}/deployments"
INFD_STATUS_PATH = f"/apis/{c.API_VERSION}/namespaces/{NS}/{c.PLURAL}/smol/status"


def conditions(kmock: Any) -> dict[str, dict[str, Any]]:
    return {cond["type"]: cond for cond in (live(kmock, INFD) or {}).get("status", {}).get("conditions") or []}


async def set_available(kmock: Any, name: str, replicas: int, available: int) -> None:
    """What the Deployment controller reports once `available` pods pass their readiness probe."""
    generation = live(kmock, DEPLOYMENTS, name)["metadata"]["generation"]  # type: ignore[index]
    await patch(kmock, f"{DEPLOYMENTS_PATH}/{name}/status", {"status": {
        "observedGeneration": generation, "replicas": replicas, "updatedReplicas": replicas,
        "readyReplicas": available, "availableReplicas": available}})


def status_writes(kmock: Any) -> int:
    return sum(1 for r in kmock._requests if r.method.value == "PATCH" and r.url.path == INFD_STATUS_PATH)


def gets_of(kmock: Any, path: str) -> int:
    return sum(1 for r in kmock._requests if r.method.value == "GET" and r.url.path == path)


async def test_ready_follows_the_router_deployment_and_resyncs_write_nothing(
        kmock: Any, operator: Any, kubeconfig: Path, kubectl_bin: Path, tmp_path: Path, crd: dict[str, Any]) -> None:
    await operator("--resync-seconds", "0.2")
    await create(kmock, infd(replicas=1, router={"enabled": True, "policy": "round-robin", "replicas": 1}))
    await wait_for(lambda: live(kmock, DEPLOYMENTS) and live(kmock, DEPLOYMENTS, "smol-router"),
                   what="worker and router Deployments")

    # The workers are ready, the router is not: users calling the router's Service get nothing yet.
    await set_available(kmock, "smol", 1, 1)
    ready = await wait_for(lambda: conditions(kmock).get("Ready", {}).get("reason") == "RouterNotReady"
                           and conditions(kmock)["Ready"], what="Ready: RouterNotReady")
    assert ready["status"] == "False" and "0/1 router replicas available" in ready["message"]
    assert conditions(kmock)["RouterReady"]["status"] == "False"
    assert conditions(kmock)["Progressing"]["reason"] == "RouterRollingOut"
    assert live(kmock, INFD)["status"]["router"]["availableReplicas"] == 0  # type: ignore[index]

    # The router's pod passes /readyz: everything users need is there.
    await set_available(kmock, "smol-router", 1, 1)
    await wait_for(lambda: conditions(kmock).get("Ready", {}).get("status") == "True", what="Ready: True")
    cs = conditions(kmock)
    assert (cs["RouterReady"]["status"], cs["RouterReady"]["reason"]) == ("True", "RouterAvailable")
    assert cs["Ready"]["reason"] == "AllReplicasReady" and "1/1 router replicas available" in cs["Ready"]["message"]
    assert (cs["Progressing"]["status"], cs["Progressing"]["reason"]) == ("False", "RolloutComplete")
    assert live(kmock, INFD)["status"]["router"] == {  # type: ignore[index]
        "replicas": 1, "readyReplicas": 1, "updatedReplicas": 1, "availableReplicas": 1, "policy": "round-robin"}

    # kubectl shows it (the Status and, wide, the Router columns).
    table = await kubectl(kubectl_bin, kubeconfig, tmp_path, "get", "infd", "-n", NS, "-o", "wide")
    header, row = table.strip("\n").splitlines()
    starts = [m.start() for m in re.finditer(r"\S+", header)]  # empty cells (no metrics yet) are blanks
    cells = {header[a:b].strip(): row[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)}
    assert (cells["STATUS"], cells["ROUTER"]) == ("AllReplicasReady", "1")
    # kubectl's own JSONPath (client-go's, as kube-apiserver evaluates printer columns) agrees with the emulator.
    for column in crd["spec"]["versions"][0]["additionalPrinterColumns"]:
        if column["name"] in ("Status", "Router"):
            value = await kubectl(kubectl_bin, kubeconfig, tmp_path, "get", "infd", "smol", "-n", NS, "-o",
                                  f"jsonpath={{{column['jsonPath']}}}")
            assert value == cells[column["name"].upper()], column

    # Converged: resync passes read the router Deployment again and again and write no status.
    router_path = f"{DEPLOYMENTS_PATH}/smol-router"
    start = gets_of(kmock, router_path)
    await wait_for(lambda: gets_of(kmock, router_path) >= start + 1, what="a resync pass after convergence")
    writes, start = status_writes(kmock), gets_of(kmock, router_path)
    await wait_for(lambda: gets_of(kmock, router_path) >= start + 3, timeout=60, what="three resync passes")
    assert status_writes(kmock) == writes, "an unchanged router status is written again"

    # The router loses its pod: Ready follows, and says it is the router.
    await set_available(kmock, "smol-router", 1, 0)
    ready = await wait_for(lambda: conditions(kmock).get("Ready", {}).get("reason") == "RouterNotReady"
                           and conditions(kmock)["Ready"], what="Ready: RouterNotReady again")
    assert ready["message"].startswith("the router is not available")

    # Turned off: the Service selects the workers again, and the router's status goes with it.
    await patch(kmock, f"/apis/{c.API_VERSION}/namespaces/{NS}/{c.PLURAL}/smol", {"spec": {"router": {"enabled": False}}})
    await wait_for(lambda: "router" not in live(kmock, INFD)["status"] and "RouterReady" not in conditions(kmock)  # type: ignore[index]
                   and conditions(kmock)["Ready"]["status"] == "True", what="router status removed")

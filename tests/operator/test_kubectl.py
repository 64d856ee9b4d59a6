"""kubectl against the KMock server the operator runs on: printer columns, short name, scale."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from kmock_cluster import DEPLOYMENTS, HPAS, INFD, wait_for
from test_operator_kmock import NS, create, infd, live, patch


async def kubectl(binary: Path, kubeconfig: Path, tmp: Path, *args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        str(binary), f"--kubeconfig={kubeconfig}", f"--cache-dir={tmp / 'kube-cache'}", "--request-timeout=10s",
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, f"kubectl {' '.join(args)} failed: {err.decode()}"
    return out.decode()


async def test_kubectl_lists_inference_deployments_with_printer_columns(
        kmock: Any, operator: Any, kubeconfig: Path, kubectl_bin: Path, tmp_path: Path) -> None:
    await operator()
    await create(kmock, infd(autoscaling={"enabled": True, "mode": "hpa", "maxReplicas": 4}))
    await wait_for(lambda: live(kmock, HPAS), what="hpa")
    # What the HPA controller would report after a sync: the operator copies it into status.metrics.
    await patch(kmock, f"/apis/autoscaling/v2/namespaces/{NS}/horizontalpodautoscalers/smol/status", {"status": {
        "currentReplicas": 1, "desiredReplicas": 1, "currentMetrics": [
            {"type": "Pods", "pods": {"metric": {"name": "hetero_infer_kv_cache_usage_ratio"},
                                      "current": {"averageValue": "625m"}}},
            {"type": "Pods", "pods": {"metric": {"name": "hetero_infer_num_requests_waiting"},
                                      "current": {"averageValue": "3"}}}]}})
    await wait_for(lambda: (live(kmock, INFD)["status"].get("metrics") or {}).get("queueDepth") == 3,
                   what="status.metrics from the HPA")

    table = await kubectl(kubectl_bin, kubeconfig, tmp_path, "get", "infd", "-n", NS)
    header, row = table.strip().splitlines()
    assert header.split() == ["NAME", "MODEL", "REPLICAS", "READY", "STATUS", "KV-USAGE", "QUEUE", "AGE"]
    cells = row.split()
    assert cells[:7] == ["smol", "smollm2", "1", "0", "NoReplicasReady", "0.625", "3"], row

    wide = await kubectl(kubectl_bin, kubeconfig, tmp_path, "get", "inferencedeployments.hetero-infer.io",
                         "-n", NS, "-o", "wide")
    assert "EXECUTOR" in wide and f"http://smol.{NS}.svc/v1" in wide

    # `kubectl scale` goes through the scale subresource; the operator carries it to the Deployment.
    await kubectl(kubectl_bin, kubeconfig, tmp_path, "scale", "infd/smol", "-n", NS, "--replicas=2")
    await wait_for(lambda: live(kmock, DEPLOYMENTS)["spec"]["replicas"] == 2, what="deployment scaled to 2")

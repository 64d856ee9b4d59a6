"""The HorizontalPodAutoscaler of autoscaling mode hpa: it scales the InferenceDeployment through its scale
subresource, on the workers' metrics."""

from __future__ import annotations

from typing import Any

from hetero_infer.operator import constants as c
from hetero_infer.operator.manifests.common import Owner, metadata
from hetero_infer.operator.spec import InferenceSpec


def quantity(value: float) -> str:
    """A metric target as a Kubernetes quantity: whole numbers plain, fractions in milli-units."""
    if float(value).is_integer():
        return str(int(value))
    return f"{round(value * 1000)}m"


def horizontal_pod_autoscaler(owner: Owner, spec: InferenceSpec) -> dict[str, Any]:
    """An autoscaling/v2 HPA that scales the InferenceDeployment itself through its scale subresource."""
    a = spec.autoscaling
    assert a.max_replicas is not None  # parse_spec guarantees it when autoscaling is enabled

    def pods_metric(name: str, target: float) -> dict[str, Any]:
        return {"type": "Pods", "pods": {"metric": {"name": name},
                                         "target": {"type": "AverageValue", "averageValue": quantity(target)}}}

    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": metadata(owner),
        "spec": {
            "scaleTargetRef": {"apiVersion": c.API_VERSION, "kind": c.KIND, "name": owner.name},
            "minReplicas": a.min_replicas,
            "maxReplicas": a.max_replicas,
            "metrics": [
                pods_metric(c.METRIC_KV_CACHE_USAGE, a.target_kv_cache_usage),
                pods_metric(c.METRIC_REQUESTS_WAITING, a.target_queue_depth),
            ],
            "behavior": {
                "scaleUp": {"stabilizationWindowSeconds": a.scale_up_stabilization_seconds},
                "scaleDown": {"stabilizationWindowSeconds": a.scale_down_stabilization_seconds},
            },
        },
    }

"""An InferencePool (Gateway API Inference Extension) over the workers, for an existing inference gateway."""

from __future__ import annotations

from typing import Any

from hetero_infer.operator import constants as c
from hetero_infer.operator.manifests.common import Owner, metadata, selector_labels
from hetero_infer.operator.spec import InferenceSpec

INFERENCE_POOL_API_VERSION = "inference.networking.k8s.io/v1"


def inference_pool(owner: Owner, spec: InferenceSpec) -> dict[str, Any] | None:
    """An InferencePool (inference.networking.k8s.io/v1) over the worker pods, for a gateway whose endpoint
    picker (spec.router.inferencePool.endpointPicker) routes to them directly."""
    pool = spec.router.inference_pool
    if pool is None:
        return None
    return {
        "apiVersion": INFERENCE_POOL_API_VERSION,
        "kind": "InferencePool",
        "metadata": metadata(owner),
        "spec": {
            "selector": {"matchLabels": selector_labels(owner.name)},
            "targetPorts": [{"number": c.WORKER_PORT}],
            "endpointPickerRef": {"kind": "Service", "name": pool.endpoint_picker,
                                  "port": {"number": pool.endpoint_picker_port}, "failureMode": "FailClose"},
        },
    }

"""The Services: the one users call (spec.service), and with the router the headless one over the workers."""

from __future__ import annotations

from typing import Any

from hetero_infer.operator import constants as c
from hetero_infer.operator.diff import spec_keys
from hetero_infer.operator.manifests.common import Owner, metadata, selector_labels, workers_service_name
from hetero_infer.operator.spec import InferenceSpec


def service(owner: Owner, spec: InferenceSpec) -> dict[str, Any]:
    """The Service users call (spec.service): it selects the router pods with spec.router, else the workers."""
    component = c.COMPONENT_ROUTER if spec.router.enabled else c.COMPONENT_WORKER
    optional = [c.OPTIONAL_ROUTER] if spec.router.enabled else []
    optional += [c.OPTIONAL_INFERENCE_POOL] if spec.router.inference_pool is not None else []
    optional += [c.OPTIONAL_INGRESS] if spec.service.ingress is not None else []
    optional += [c.OPTIONAL_HTTP_ROUTE] if spec.service.http_route is not None else []
    meta = metadata(owner, component=component)
    svc = spec.service
    # spec.service.annotations (e.g. an internal load balancer's), and which keys are the spec's, so that a key it
    # drops is removed; absent without them, so a spec without them renders the Service as before
    annotations = {**svc.annotations, c.SPEC_KEYS_ANNOTATION: spec_keys({"metadata.annotations": svc.annotations})}
    if optional:
        annotations[c.OPTIONAL_CHILDREN_ANNOTATION] = ",".join(optional)
    meta["annotations"] = {k: v for k, v in annotations.items() if v is not None} or None
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "type": svc.type,
            "selector": selector_labels(owner.name, component),
            "ports": [{
                "name": c.WORKER_PORT_NAME,
                "port": svc.port,
                "targetPort": c.WORKER_PORT_NAME,
                "protocol": "TCP",
            }],
            "loadBalancerClass": svc.load_balancer_class,
            "loadBalancerSourceRanges": list(svc.load_balancer_source_ranges) or None,
        },
    }


def workers_service(owner: Owner) -> dict[str, Any]:
    """Headless Service over the worker pods: its EndpointSlices are what the router discovers workers from
    (ready endpoints only), and what a ServiceMonitor scrapes the workers' /metrics through."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(owner, workers_service_name(owner.name)),
        "spec": {
            "type": "ClusterIP",
            "clusterIP": "None",
            "selector": selector_labels(owner.name),
            "ports": [{"name": c.WORKER_PORT_NAME, "port": c.WORKER_PORT, "targetPort": c.WORKER_PORT_NAME,
                       "protocol": "TCP"}],
        },
    }

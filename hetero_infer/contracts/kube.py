"""What the router and the operator both need of Kubernetes: the InferenceDeployment's API names and the
kubeconfig's credentials (through the `kubernetes` package, imported only when called)."""

from __future__ import annotations

import os
from typing import Any

GROUP = "hetero-infer.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferenceDeployment"
PLURAL = "inferencedeployments"

# With the per-model router (spec.router.enabled) the Service over the worker pods is <name>-workers; without
# it, the Service <name> selects the workers itself. The cluster router watches that Service's EndpointSlices.
WORKERS_SERVICE_SUFFIX = "-workers"


def workers_service(name: str, router_enabled: bool) -> str:
    """The Service whose EndpointSlices list an InferenceDeployment's worker pods."""
    return name + WORKERS_SERVICE_SUFFIX if router_enabled else name


SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


def in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and os.path.exists(SERVICE_ACCOUNT_TOKEN)


def load_configuration() -> Any:
    """A `kubernetes.client.Configuration`: in-cluster credentials in a pod, else the kubeconfig.

    $KUBECONFIG is read at call time (the kubernetes package reads it once at import), so a
    re-login after the variable changed uses the new file.
    """
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config

    cfg = k8s_client.Configuration()
    if in_cluster():
        k8s_config.load_incluster_config(client_configuration=cfg)
    else:
        path = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
        k8s_config.load_kube_config(config_file=path, client_configuration=cfg)
    return cfg


def authorization_header(cfg: Any) -> str | None:
    """The Authorization header value (client versions differ in where they keep the token)."""
    if not cfg.api_key:
        return None
    return cfg.get_api_key_with_prefix("BearerToken") or cfg.get_api_key_with_prefix("authorization") or None

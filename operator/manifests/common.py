"""What every child shares: its owner, names, labels and metadata, the operator-wide defaults, the probes."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

from hetero_infer.operator import constants as c
from hetero_infer.operator.spec import WORKERS_SERVICE_SUFFIX, InferenceSpec

WORKER_UID = 10001


@dataclass(frozen=True)
class WorkerDefaults:
    """Operator-wide settings that are not part of a spec (set by the operator's flags)."""

    image: str = c.DEFAULT_WORKER_IMAGE
    gpu_image: str = c.DEFAULT_WORKER_GPU_IMAGE
    image_pull_policy: str | None = None  # None: Kubernetes' default for the tag
    router_image: str = c.DEFAULT_ROUTER_IMAGE
    image_pull_secrets: tuple[str, ...] = ()  # for specs without spec.imagePullSecrets


@dataclass(frozen=True)
class Owner:
    """The InferenceDeployment the children belong to."""

    name: str
    namespace: str
    uid: str


def selector_labels(name: str, component: str = c.COMPONENT_WORKER) -> dict[str, str]:
    return {c.LABEL_OWNER: name, c.LABEL_COMPONENT: component}


def common_labels(name: str, component: str = c.COMPONENT_WORKER) -> dict[str, str]:
    return {
        c.LABEL_NAME: c.APP_NAME,
        c.LABEL_INSTANCE: name,
        c.LABEL_MANAGED_BY: c.MANAGED_BY,
        **selector_labels(name, component),
    }


def selector_string(name: str) -> str:
    """`.status.selector` for the scale subresource (what an HPA counts pods with)."""
    return ",".join(f"{k}={v}" for k, v in sorted(selector_labels(name).items()))


def owner_reference(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": c.API_VERSION,
        "kind": c.KIND,
        "name": owner.name,
        "uid": owner.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def scrape_annotations() -> dict[str, str]:
    """Prometheus' pod annotations: workers and routers both serve /metrics on the same port."""
    return {"prometheus.io/scrape": "true", "prometheus.io/port": str(c.WORKER_PORT), "prometheus.io/path": "/metrics"}


def metadata(owner: Owner, name: str | None = None, component: str = c.COMPONENT_WORKER) -> dict[str, Any]:
    return {
        "name": name or owner.name,
        "namespace": owner.namespace,
        "labels": common_labels(owner.name, component),
        "ownerReferences": [owner_reference(owner)],
    }


def probe(path: str, period: int, failures: int, timeout: int = 3) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": c.WORKER_PORT_NAME},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
    }

ROUTER_SUFFIX = "-router"


def router_name(name: str) -> str:
    """The router's Deployment, ServiceAccount, Role and RoleBinding."""
    return name + ROUTER_SUFFIX


def workers_service_name(name: str) -> str:
    """With the router: the Service over the worker pods, whose EndpointSlices the router watches."""
    return name + WORKERS_SERVICE_SUFFIX


def endpoint(owner: Owner, spec: InferenceSpec) -> str:
    """The in-cluster base URL of the OpenAI-compatible API behind the Service."""
    port = "" if spec.service.port == 80 else f":{spec.service.port}"
    return f"http://{owner.name}.{owner.namespace}.svc{port}/v1"


def image_pull_secrets(spec: InferenceSpec, defaults: WorkerDefaults) -> list[dict[str, str]] | None:
    """spec.imagePullSecrets, else the operator's (--image-pull-secrets), for the worker and the router pods."""
    return [{"name": n} for n in spec.pod.image_pull_secrets or defaults.image_pull_secrets] or None


MODEL_CACHE_SUFFIX = "-model-cache"
FETCH_JOB_INFIX = "-fetch-"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def url_digest(url: str) -> str:
    return hashlib.sha256(url.encode()).hexdigest()[:10]


def cache_key(url: str) -> str:
    """The folder in the model cache for one source and revision (spec.model.url, @REVISION included): readable,
    and unique by a digest of the whole url, so a new revision downloads beside the old one."""
    scheme, _, rest = url.partition("://")
    readable = _UNSAFE.sub("-", f"{scheme}-{rest}").strip("-.")[:80]
    return f"{readable}-{url_digest(url)}"


def cache_claim_name(owner: Owner, spec: InferenceSpec) -> str:
    """The cache's PersistentVolumeClaim: the given one, or the one the operator creates."""
    cache = spec.model.cache
    return cache.claim_name if cache is not None and cache.claim_name else owner.name + MODEL_CACHE_SUFFIX


def fetch_job_name(owner: Owner, key: str, shared_claim: str | None = None) -> str:
    """The download Job of one cache folder (cache_key: its url's digest ends it); a DNS-1123 label, as its pods
    carry it as a label value. On an existing claim (`shared_claim`, cache.claimName) that other InferenceDeployments
    may share, named by the claim and the folder: one Job per claim and source, never two writing one folder."""
    if shared_claim:
        prefix = re.sub(r"[^a-z0-9-]", "-", shared_claim[:40]).strip("-")
        return f"{prefix}{FETCH_JOB_INFIX}{url_digest(shared_claim + '/' + key)}"
    return f"{owner.name[:40].rstrip('-')}{FETCH_JOB_INFIX}{key.rsplit('-', 1)[-1]}"

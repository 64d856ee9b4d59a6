"""spec.model.cache: the claim the operator creates (with cache.size) and the download Job that fills one folder
of the cache per source and revision (common.cache_key), which the workers then mount read-only.

The Job runs the worker's image: `hetero-infer fetch URL --link /models/KEY/model` with the credentials Secret
as its environment, HF_HOME and HETERO_INFER_MODEL_CACHE under /models/KEY, and restartPolicy Never, so every
failed attempt leaves a pod whose termination message (the log's last lines) says why; the Job controller
retries with exponential back-off (10 s, 20 s, ... capped at 6 min) up to FETCH_BACKOFF_LIMIT times.
"""

from __future__ import annotations

from typing import Any

from hetero_infer.operator import constants as c
from hetero_infer.operator.manifests.common import (
    MODEL_CACHE_SUFFIX,
    Owner,
    WorkerDefaults,
    cache_key,
    common_labels,
    fetch_job_name,
    image_pull_secrets,
    metadata,
)
from hetero_infer.operator.manifests.worker import (
    MODEL_MOUNT,
    container_security,
    fetch_container,
    pod_security,
    worker_image,
)
from hetero_infer.operator.spec import InferenceSpec

FETCH_BACKOFF_LIMIT = 6  # Kubernetes' default, stated: about 10 minutes of retries before the Job fails
CACHE_ACCESS_MODES = ["ReadWriteMany"]  # one download, every worker on any node reads it


def cache_claim(owner: Owner, spec: InferenceSpec) -> dict[str, Any] | None:
    """The claim the operator creates for spec.model.cache.size; None for an existing claim or without a cache."""
    cache = spec.model.cache
    if cache is None or cache.claim_name:
        return None
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": metadata(owner, owner.name + MODEL_CACHE_SUFFIX, c.COMPONENT_MODEL_CACHE),
        "spec": {
            "accessModes": list(CACHE_ACCESS_MODES),
            "resources": {"requests": {"storage": cache.size}},
            "storageClassName": cache.storage_class_name,  # None: the cluster's default class
        },
    }


def download_job(owner: Owner, spec: InferenceSpec, defaults: WorkerDefaults, claim: str) -> dict[str, Any]:
    """The Job that downloads spec.model.url into its folder of the cache claim `claim`."""
    url = spec.model.url
    assert url is not None and spec.model.cache is not None, "a download Job needs spec.model.url and .cache"
    key = cache_key(url)
    container = fetch_container(spec, worker_image(spec, defaults), defaults, container_security(), cached=key)
    meta = metadata(owner, fetch_job_name(owner, key), c.COMPONENT_MODEL_CACHE)
    meta["annotations"] = {c.MODEL_URL_ANNOTATION: url, c.MODEL_CACHE_KEY_ANNOTATION: key}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            "backoffLimit": FETCH_BACKOFF_LIMIT,
            "template": {
                "metadata": {"labels": common_labels(owner.name, c.COMPONENT_MODEL_CACHE)},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [container],
                    "volumes": [{"name": "tmp", "emptyDir": {}},
                                {"name": "model", "persistentVolumeClaim": {"claimName": claim}}],
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": pod_security(),
                    "imagePullSecrets": image_pull_secrets(spec, defaults),
                },
            },
        },
    }


__all__ = ["CACHE_ACCESS_MODES", "FETCH_BACKOFF_LIMIT", "MODEL_MOUNT", "cache_claim", "cache_key", "download_job"]

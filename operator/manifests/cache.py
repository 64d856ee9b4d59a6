"""spec.model.cache: the claim the operator creates (with cache.size) and the download Job that fills one folder
of the cache per source and revision (common.cache_key), which the workers then mount read-only.

The Job runs `hetero-infer fetch URL --link /models/KEY/model` in the operator's CPU worker image (a download needs
no CUDA; spec.model.cache.download.image, or the worker's image for a GGUF inside it) with the credentials Secret
as its environment, HF_HOME and HETERO_INFER_MODEL_CACHE under /models/KEY, and restartPolicy Never, so every
failed attempt leaves a pod whose termination message (the log's last lines) says why; the Job controller
retries with exponential back-off (10 s, 20 s, ... capped at 6 min) up to backoffLimit times, except a failure
no retry can help (not found, access denied: fetch's EXIT_PERMANENT), which fails the Job at once
(podFailurePolicy). spec.model.cache.download places it (nodeSelector, tolerations, affinity, priority), names
who it runs as (serviceAccountName: IRSA, Workload Identity) and adds volumes (a private CA bundle).

On an existing claim (cache.claimName) shared by several InferenceDeployments, one Job per claim and source
writes a folder (fetch_job_name): the first to need it creates it, the others wait on the same Job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hetero_infer.model_source import EXIT_PERMANENT
from hetero_infer.operator import constants as c
from hetero_infer.operator.manifests.common import (
    MODEL_CACHE_SUFFIX,
    Owner,
    WorkerDefaults,
    cache_claim_name,
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
    split_check,
    worker_image,
    worker_memory,
)
from hetero_infer.operator.spec import (
    DEFAULT_CACHE_ACCESS_MODES,
    DEFAULT_FETCH_BACKOFF_LIMIT,
    AdapterSpec,
    InferenceSpec,
)

FETCH_BACKOFF_LIMIT = DEFAULT_FETCH_BACKOFF_LIMIT
CACHE_ACCESS_MODES = list(DEFAULT_CACHE_ACCESS_MODES)  # one download, every worker on any node reads it
SOURCE_MOUNT = "/source"  # a GGUF's claim, read-only, in the download Job


@dataclass(frozen=True)
class FetchSource:
    """What the download Job fetches into the cache: `name` keys the cache folder (common.cache_key) and is what
    status.model.url shows; `argument` is `hetero-infer fetch`'s; a GGUF is converted into `gguf_dtype`, from
    the image or from the claim `claim` (mounted at SOURCE_MOUNT)."""

    name: str
    argument: str
    gguf_dtype: str | None = None
    claim: str | None = None
    adapter: str | None = None  # a LoRA adapter of spec.adapters (fetched with --adapter), named so


def adapter_source(adapter: AdapterSpec) -> FetchSource:
    """What the download Job of an hf:// or s3:// LoRA adapter fetches."""
    return FetchSource(adapter.url, adapter.url, adapter=adapter.name)


def fetch_source(spec: InferenceSpec, defaults: WorkerDefaults) -> FetchSource:
    """spec.model's source with a cache: its hf:// or s3:// url, else its .gguf file (spec.py allows no other),
    converted once into bfloat16 for GPU workers (half float32's size; what they compute in) or float32 on CPU."""
    m = spec.model
    if m.url is not None:
        return FetchSource(m.url, m.url)
    dtype = "bfloat16" if spec.resources.gpus > 0 else "float32"
    if m.pvc is not None and m.pvc.sub_path:
        return FetchSource(f"pvc://{m.pvc.claim_name}/{m.pvc.sub_path} as {dtype}",
                           f"{SOURCE_MOUNT}/{m.pvc.sub_path}", dtype, m.pvc.claim_name)
    assert m.path is not None, "spec.py allows a cache only with a url or a .gguf file"
    return FetchSource(f"{worker_image(spec, defaults)}:{m.path} as {dtype}", m.path, dtype)


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
            "accessModes": list(cache.access_modes),
            "resources": {"requests": {"storage": cache.size}},
            "storageClassName": cache.storage_class_name,  # None: the cluster's default class
            "volumeName": cache.volume_name,
        },
    }


def download_image(spec: InferenceSpec, defaults: WorkerDefaults) -> str:
    """download.image; else the worker's image for a GGUF inside it (the file is there), else the operator's CPU
    worker image: `hetero-infer fetch` needs no CUDA, and a CPU node pool need not pull a CUDA image."""
    assert spec.model.cache is not None
    if spec.model.cache.download.image:
        return spec.model.cache.download.image
    if spec.model.path is not None:  # a .gguf file in the worker's image
        return worker_image(spec, defaults)
    return defaults.image


def pod_failure_policy() -> dict[str, Any]:
    """Fail the Job at once when the fetch says no retry can help (a 401/403/404: EXIT_PERMANENT, or a bad command
    line), and do not count a pod a node drain or preemption took (DisruptionTarget) as a failed attempt."""
    return {"rules": [
        {"action": "FailJob", "onExitCodes": {"containerName": "fetch-model", "operator": "In",
                                              "values": [2, EXIT_PERMANENT]}},
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
    ]}


def download_job(owner: Owner, spec: InferenceSpec, defaults: WorkerDefaults, claim: str,
                 source: FetchSource | None = None) -> dict[str, Any]:
    """The Job that fetches `source` (default: the model, fetch_source) into its folder of the cache claim
    `claim`."""
    assert spec.model.cache is not None, "a download Job needs spec.model.cache"
    dl = spec.model.cache.download
    source = source or fetch_source(spec, defaults)
    key = cache_key(source.name)
    options: tuple[str, ...] = ("--gguf-dtype", source.gguf_dtype) if source.gguf_dtype else ()
    if source.adapter is not None:
        options += ("--adapter",)
    elif not spec.model.cache.claim_name:  # a shared claim's Job serves deployments of any gpus: the workers check
        options += split_check(spec)
    container = fetch_container(spec, download_image(spec, defaults), defaults, container_security(spec), cached=key,
                                source=source.argument, options=options)
    volumes: list[dict[str, Any]] = [{"name": "tmp", "emptyDir": {}},
                                     {"name": "model", "persistentVolumeClaim": {"claimName": claim}}]
    if source.gguf_dtype:  # the conversion holds the whole model in memory, as the worker does: the worker's room
        memory = worker_memory(spec)
        container["resources"] = {"requests": {"cpu": "1", "memory": memory}, "limits": {"memory": memory}}
    if dl.cpu or dl.memory:
        requests, limits = container["resources"]["requests"], container["resources"]["limits"]
        requests["cpu"] = dl.cpu or requests["cpu"]
        requests["memory"] = limits["memory"] = dl.memory or requests["memory"]
    if source.claim is not None:
        volumes.append({"name": "source", "persistentVolumeClaim": {"claimName": source.claim, "readOnly": True}})
        container["volumeMounts"].append({"name": "source", "mountPath": SOURCE_MOUNT, "readOnly": True})
    volumes += [dict(v) for v in dl.volumes]
    container["volumeMounts"] += [dict(m) for m in dl.volume_mounts]
    meta = metadata(owner, fetch_job_name(owner, key, spec.model.cache.claim_name), c.COMPONENT_MODEL_CACHE)
    meta["annotations"] = {c.MODEL_URL_ANNOTATION: source.name, c.MODEL_CACHE_KEY_ANNOTATION: key,
                           c.MODEL_CACHE_CLAIM_ANNOTATION: cache_claim_name(owner, spec)}
    if source.adapter is not None:
        meta["annotations"][c.ADAPTER_ANNOTATION] = source.adapter
    template_meta: dict[str, Any] = {"labels": {**dl.labels, **common_labels(owner.name, c.COMPONENT_MODEL_CACHE)}}
    if dl.annotations:
        template_meta["annotations"] = dict(dl.annotations)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            "backoffLimit": dl.backoff_limit,
            "activeDeadlineSeconds": dl.active_deadline_seconds,
            "podFailurePolicy": pod_failure_policy(),
            "template": {
                "metadata": template_meta,
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [container],
                    "volumes": volumes,
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": pod_security(spec),
                    "imagePullSecrets": image_pull_secrets(spec, defaults),
                    "serviceAccountName": dl.service_account_name,
                    "priorityClassName": dl.priority_class_name,
                    "nodeSelector": dict(dl.node_selector) or None,
                    "tolerations": [dict(t) for t in dl.tolerations] or None,
                    "affinity": dl.affinity,
                },
            },
        },
    }


__all__ = ["CACHE_ACCESS_MODES", "FETCH_BACKOFF_LIMIT", "MODEL_MOUNT", "SOURCE_MOUNT", "FetchSource", "adapter_source",
           "cache_claim", "cache_key", "download_image", "download_job", "fetch_source", "pod_failure_policy"]

"""The InferenceDeployment CustomResourceDefinition, written once (issue 44): `SCHEMA` below, in the typed nodes of
operator/schema.py, is the source of crds/{CRD_NAME}.yaml and the chart's copy (`python -m
hetero_infer.operator.crd` writes both; tests/operator/test_crd_generated.py fails when they are not current), and
of what operator/spec.py checks (allowed keys, bounds, enums, defaults: read from here, not restated).

A new field goes here once, then into spec.py's typed InferenceSpec and its rendering; regenerate the files.
"""

from __future__ import annotations

import sys
import typing
from pathlib import Path
from typing import Any

import yaml

from hetero_infer.contracts.engine_options import DTYPES, EXECUTORS, MAX_LORA_RANK, Quantization
from hetero_infer.contracts.lora_modules import ADAPTER_NAME
from hetero_infer.contracts.router_options import RouterOptions
from hetero_infer.operator import constants as c
from hetero_infer.operator.schema import (
    DNS1123_SUBDOMAIN_PATTERN,
    Arr,
    Bool,
    Free,
    Int,
    IntOrStr,
    Map,
    Num,
    Obj,
    Quantity,
    Rule,
    Str,
)
from hetero_infer.operator.spec_overrides import DEFAULT_LIVENESS, DEFAULT_READINESS

# A host name as Ingress and HTTPRoute take it: DNS labels, optionally a leading "*." wildcard.
HOSTNAME_PATTERN = r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
HEADER_NAME_PATTERN = "^[A-Za-z0-9!#$%&'*+.^_`|~-]+$"  # an HTTP field name (RFC 9110's token)

QUANTIZATIONS = typing.get_args(Quantization)
ROUTER_DEFAULTS = RouterOptions()  # the router's own defaults, which a spec without the field keeps
ROUTER_POLICIES = typing.get_args(typing.get_type_hints(RouterOptions)["policy"])
ROUTER_TOKENIZERS = ("workers", "none")  # the router's --tokenizer values that need nothing in the router pod



def NAME(description: str | None = None) -> Str:  # noqa: N802  (a node, named like the others)
    """The name of a Secret, ServiceAccount, PriorityClass, ...: a DNS-1123 subdomain."""
    return Str(description=description, pattern=DNS1123_SUBDOMAIN_PATTERN, max_length=253)


# A model's or a LoRA adapter's url (spec.py's MODEL_URL is the same pattern, for clusters without CEL).
URL_RULES = (
    Rule(
        "self.matches('^(hf://[A-Za-z0-9][-_.A-Za-z0-9]*(/[A-Za-z0-9][-_.A-Za-z0-9]*)?(@[^@ ]+)?|s3://[a-z0-9][-.a-z0-9]{1,61}[a-z0-9](/.*)?|pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?(/.*)?)$')",
        "url must be hf://ORG/NAME[@REVISION], s3://BUCKET/PREFIX or pvc://CLAIM/PATH",
    ),
    Rule(
        "!self.startsWith('pvc://') || !self.matches('(^|/)[.][.](/|$)')",
        "the path in a pvc:// url must not contain '..'",
    ),
)
MAX_ADAPTERS = 256

SECRET_KEY_REF = Obj(
    required=("name", "key"),
    properties={
        "name": Str(description="The Secret's name (in the InferenceDeployment's namespace).",
                    pattern=DNS1123_SUBDOMAIN_PATTERN, max_length=253),
        "key": Str(description="The key in the Secret that holds the API key.", min_length=1, max_length=253),
    },
)
TOLERATION = Obj(properties={
    "key": Str(),
    "operator": Str(enum=("Exists", "Equal")),
    "value": Str(),
    "effect": Str(enum=("NoSchedule", "PreferNoSchedule", "NoExecute")),
    "tolerationSeconds": Int(format="int64"),
})
SPREAD_CONSTRAINT = Obj(  # a core/v1 TopologySpreadConstraint: its labelSelector is the user's to give
    required=("maxSkew", "topologyKey", "whenUnsatisfiable"),
    preserve_unknown=True,
    properties={
        "maxSkew": Int(minimum=1, format="int32"),
        "topologyKey": Str(min_length=1),
        "whenUnsatisfiable": Str(enum=("DoNotSchedule", "ScheduleAnyway")),
    },
)

# What the operator mounts itself: extra volumes and mounts (spec.volumes, spec.model.cache.download.volumes) must not
# take these names and paths (manifests/worker.py, manifests/cache.py).
OWN_VOLUMES = ("tmp", "cache", "dshm", "model", "lora-adapters")
OWN_MOUNT_PATHS = ("/tmp", "/var/cache/hetero-infer", "/dev/shm", "/models", c.ADAPTERS_CONFIG_DIR, c.ADAPTERS_MOUNT)
DOWNLOAD_OWN_VOLUMES = ("tmp", "model", "source")
DOWNLOAD_OWN_MOUNT_PATHS = ("/tmp", "/models", "/source")


def _listing(items: tuple[str, ...]) -> str:
    return ", ".join(items[:-1]) + " and " + items[-1]


def _cel_list(items: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{i}'" for i in items) + "]"


def extra_volume(own: tuple[str, ...]) -> Obj:
    """A core/v1 Volume of the user's, not named like one of the operator's (`own`)."""
    return Obj(rules=(Rule(f"!(self.name in {_cel_list(own)})", f"volume names {_listing(own)} are the operator's own"),),
               required=("name",), preserve_unknown=True,
               properties={"name": Str(pattern="^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)})


def extra_mount(own: tuple[str, ...]) -> Obj:
    """A core/v1 VolumeMount of the user's, not over one of the operator's mount paths (`own`)."""
    return Obj(rules=(Rule(f"!(self.mountPath in {_cel_list(own)})",
                           f"mount paths {_listing(own)} are the operator's own"),),
               required=("name", "mountPath"), preserve_unknown=True,
               properties={"name": Str(max_length=63), "mountPath": Str(pattern="^/", max_length=1024)})


def pod_labels(description: str | None, message: str) -> Map:
    """Extra pod labels: not the ones the operator selects its pods by."""
    selecting = (c.LABEL_OWNER, c.LABEL_COMPONENT, c.LABEL_NAME, c.LABEL_INSTANCE, c.LABEL_MANAGED_BY)
    return Map(description=description, rules=(Rule(f"!{_cel_list(selecting)}.exists(k, k in self)", message),))


def probe_tuning(name: str, default_period: int) -> Obj:
    """spec.probes.<name>: a probe's timings (the operator's defaults in spec_overrides.py)."""
    return Obj(
        rules=(Rule(f"!has(self.timeoutSeconds) || self.timeoutSeconds <= (has(self.periodSeconds) ? "
                    f"self.periodSeconds : {default_period})",
                    f"probes.{name}.timeoutSeconds must not exceed periodSeconds"),),
        properties={
            "periodSeconds": Int(minimum=1, maximum=300),
            "timeoutSeconds": Int(minimum=1, maximum=120),
            "failureThreshold": Int(minimum=1, maximum=100),
        },
    )


SCHEMA: Obj = Obj(
    description="A served model backed by hetero-infer worker pods.",
    rules=(
        Rule(
            "self.metadata.name.size() <= 63",
            "metadata.name must be at most 63 characters (it names the Service)",
        ),
        Rule(
            "!has(self.spec.router) || !self.spec.router.enabled || self.metadata.name.size() <= 55",
            "metadata.name must be at most 55 characters with the router enabled (the worker Service is <name>-workers)",
        ),
    ),
    required=("spec",),
    properties={
        "apiVersion": Str(),
        "kind": Str(),
        "metadata": Obj(),
        "spec": Obj(
            rules=(
                Rule(
                    "!has(self.autoscaling) || self.autoscaling.minReplicas != 0 || (has(self.router) && self.router.enabled)",
                    "autoscaling.minReplicas 0 (scale to zero) needs router.enabled true, so that requests are held while the first worker starts",
                ),
                Rule(
                    "!has(self.autoscaling) || self.autoscaling.minReplicas != 0 || self.autoscaling.mode == 'operator'",
                    "autoscaling.minReplicas 0 (scale to zero) needs mode operator (the HPA cannot scale from zero on the workers' metrics)",
                ),
                Rule(
                    "!has(self.terminationGracePeriodSeconds) || self.terminationGracePeriodSeconds >= 10 + (has(self.drainSeconds) ? self.drainSeconds : 45)",
                    "terminationGracePeriodSeconds must be at least drainSeconds + 10 (the preStop)",
                ),
                Rule(
                    "!has(self.volumeMounts) || self.volumeMounts.all(m, has(self.volumes) && self.volumes.exists(v, v.name == m.name))",
                    "every volumeMounts[].name must name one of spec.volumes",
                ),
                Rule(
                    "!has(self.model.cache) || !has(self.model.cache.accessModes) || self.model.cache.accessModes.exists(m, m in ['ReadWriteMany', 'ReadOnlyMany']) || ((has(self.replicas) ? self.replicas : 1) <= 1 && (!has(self.autoscaling) || !self.autoscaling.enabled || !has(self.autoscaling.maxReplicas) || self.autoscaling.maxReplicas <= 1))",
                    "model.cache.accessModes without ReadWriteMany or ReadOnlyMany lets one node mount the cache; serve one replica or add one of them",
                ),
            ),
            required=("model",),
            properties={
                "model": Obj(
                    description="The model to serve. Weights come from the image's default model unless one of path (inside the image), pvc, hostPath or url is given.",
                    rules=(
                        Rule(
                            "[has(self.path), has(self.pvc), has(self.hostPath), has(self.url)].filter(x, x).size() <= 1",
                            "give at most one of path, pvc, hostPath and url",
                        ),
                        Rule(
                            "!has(self.cache) || (has(self.url) && (self.url.startsWith('hf://') || self.url.startsWith('s3://') || (self.url.startsWith('pvc://') && self.url.matches('(?i)[.]gguf$')))) || (has(self.path) && self.path.matches('(?i)[.]gguf$')) || (has(self.pvc) && has(self.pvc.subPath) && self.pvc.subPath.matches('(?i)[.]gguf$'))",
                            "cache needs url hf://ORG/NAME[@REVISION] or s3://BUCKET/PREFIX (what the download Job fetches), or a .gguf file (path, or pvc with a subPath) that it converts once",
                        ),
                    ),
                    required=("name",),
                    properties={
                        "url": Str(
                            description="Where the model is: hf://ORG/NAME[@REVISION] (the Hugging Face Hub, or HF_ENDPOINT from credentialsSecret), s3://BUCKET/PREFIX (an S3-compatible store; AWS_ENDPOINT_URL from credentialsSecret) or pvc://CLAIM/PATH (a PersistentVolumeClaim, mounted read-only). hf:// and s3:// models are downloaded by each pod's init container into a volume of downloadSize (docs/models.md).",
                            rules=URL_RULES,
                            max_length=4096,
                        ),
                        "credentialsSecret": Str(
                            description="A Secret in the namespace whose keys become the downloader's and the worker's environment: HF_TOKEN (private or gated Hub models), HF_ENDPOINT, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, AWS_REGION. Never put credentials in env.",
                            pattern=DNS1123_SUBDOMAIN_PATTERN,
                            max_length=253,
                        ),
                        "downloadSize": Quantity(
                            description="Room for an hf:// or s3:// download: the download volume's sizeLimit and the pod's ephemeral-storage request (default 20Gi; about 2 bytes per parameter in bfloat16). Not used with cache.",
                        ),
                        "cache": Obj(
                            description="A cache shared by every worker for an hf:// or s3:// url, or a .gguf file (path, or pvc with a subPath) converted once (bfloat16 for GPU workers, float32 on CPU): one download Job (the worker image running hetero-infer fetch, with credentialsSecret) fills it once per source and revision, and the workers, which mount it read-only, are started (or rolled to a new revision) only once that Job completed; the ModelReady condition follows the download. claimName: an existing ReadWriteMany claim; or size (and storageClassName) for a ReadWriteMany claim the operator creates, NAME-model-cache, deleted with this InferenceDeployment (docs/kubernetes.md).",
                            rules=(
                                Rule(
                                    "has(self.claimName) != has(self.size)",
                                    "cache needs claimName (an existing claim) or size (and storageClassName) for a claim the operator creates, not both",
                                ),
                                Rule(
                                    "!has(self.claimName) || !has(self.storageClassName)",
                                    "cache.storageClassName applies to a claim the operator creates (with size), not to claimName",
                                ),
                                Rule(
                                    "!has(self.claimName) || (!has(self.accessModes) && !has(self.volumeName))",
                                    "cache.accessModes and volumeName apply to a claim the operator creates (with size), not to claimName",
                                ),
                            ),
                            properties={
                                "claimName": Str(
                                    description="An existing PersistentVolumeClaim (ReadWriteMany) in the namespace.",
                                    pattern=DNS1123_SUBDOMAIN_PATTERN,
                                    max_length=253,
                                ),
                                "size": Quantity(
                                    description="The size of the claim the operator creates: room for every revision kept (about 2 bytes per parameter in bfloat16; an 8B model takes 16 GB).",
                                ),
                                "storageClassName": Str(
                                    description="The StorageClass of the claim the operator creates (one that offers ReadWriteMany, such as an NFS or CephFS class); default, the cluster's default class.",
                                    pattern=DNS1123_SUBDOMAIN_PATTERN,
                                    max_length=253,
                                ),
                                "accessModes": Arr(
                                    description="The access modes of the claim the operator creates (default [ReadWriteMany]). The download Job writes it, so one mode must be writable; several worker replicas read it from several nodes, so with more than one it needs ReadWriteMany or ReadOnlyMany (e.g. [ReadWriteOnce, ReadOnlyMany] on a GCE persistent disk); ReadWriteOnce alone serves one replica.",
                                    rules=(
                                        Rule(
                                            "self.exists(m, m in ['ReadWriteMany', 'ReadWriteOnce', 'ReadWriteOncePod'])",
                                            "cache.accessModes needs a writable mode (the download Job writes the claim)",
                                        ),
                                    ),
                                    min_items=1,
                                    max_items=4,
                                    items=Str(
                                        enum=(
                                            "ReadWriteMany",
                                            "ReadWriteOnce",
                                            "ReadOnlyMany",
                                            "ReadWriteOncePod",
                                        ),
                                    ),
                                ),
                                "volumeName": Str(
                                    description="Bind the claim the operator creates to this (pre-provisioned) PersistentVolume.",
                                    pattern=DNS1123_SUBDOMAIN_PATTERN,
                                    max_length=253,
                                ),
                                "download": Obj(
                                    description="Where the download Job runs, as whom and with what; each only when given. Its image is the operator's CPU worker image unless given here (or the worker's, for a .gguf inside it). A 401, 403 or 404 fails the Job at once (podFailurePolicy); other failures are retried backoffLimit times.",
                                    rules=(
                                        Rule(
                                            "!has(self.volumeMounts) || self.volumeMounts.all(m, has(self.volumes) && self.volumes.exists(v, v.name == m.name))",
                                            "every download.volumeMounts[].name must name one of download.volumes",
                                        ),
                                    ),
                                    properties={
                                        "image": Str(
                                            description="The download Job's image (any hetero-infer image; it runs hetero-infer fetch).",
                                            min_length=1,
                                        ),
                                        "nodeSelector": Map(
                                            description="Where the Job runs, e.g. a CPU node pool (a download needs no GPU).",
                                        ),
                                        "tolerations": Arr(
                                            max_items=32,
                                            items=TOLERATION,
                                        ),
                                        "affinity": Free(description="A core/v1 Affinity for the Job's pod."),
                                        "serviceAccountName": Str(
                                            description="The Job pod's ServiceAccount: IRSA (eks.amazonaws.com/role-arn), GKE or Azure Workload Identity give it the store's credentials without static keys in a Secret.",
                                            pattern=DNS1123_SUBDOMAIN_PATTERN,
                                            max_length=253,
                                        ),
                                        "priorityClassName": NAME(),
                                        "podAnnotations": Map(),
                                        "podLabels": pod_labels("Extra labels on the Job's pod (e.g. azure.workload.identity/use).", "podLabels must not set the labels the operator sets"),
                                        "volumes": Arr(
                                            description="Extra core/v1 Volumes for the Job's pod, e.g. a ConfigMap with a private CA bundle.",
                                            max_items=16,
                                            items=extra_volume(DOWNLOAD_OWN_VOLUMES),
                                        ),
                                        "volumeMounts": Arr(
                                            description="Extra VolumeMounts for the fetch container, of download.volumes.",
                                            max_items=16,
                                            items=extra_mount(DOWNLOAD_OWN_MOUNT_PATHS),
                                        ),
                                        "activeDeadlineSeconds": Int(
                                            description="The Job fails once it has run this long (all attempts); default no limit.",
                                            minimum=60,
                                            maximum=604800,
                                        ),
                                        "backoffLimit": Int(
                                            description="Attempts retried after a failure that a retry may fix (network, no space).",
                                            minimum=0,
                                            maximum=100,
                                            default_value=6,
                                        ),
                                        "resources": Obj(
                                            properties={
                                                "cpu": Quantity(),
                                                "memory": Quantity(),
                                            },
                                        ),
                                    },
                                ),
                            },
                        ),
                        "name": Str(
                            description='The served model name (what clients put in "model").',
                            min_length=1,
                            max_length=253,
                        ),
                        "path": Str(
                            description="Absolute path inside the image to an HF folder or a .gguf file.",
                            pattern="^/",
                            max_length=4096,
                        ),
                        "pvc": Obj(
                            description="Weights on a PersistentVolumeClaim, mounted read-only at /models.",
                            required=("claimName",),
                            properties={
                                "claimName": Str(min_length=1, max_length=253),
                                "subPath": Str(
                                    description="Path inside the volume to the HF folder or .gguf file.",
                                    rules=(
                                        Rule(
                                            "!self.matches('(^|/)[.][.](/|$)')",
                                            "subPath must not contain '..'",
                                        ),
                                    ),
                                    pattern="^[^/]",
                                    max_length=4096,
                                ),
                                "readOnly": Bool(default_value=True),
                            },
                        ),
                        "hostPath": Obj(
                            description="Weights in a directory on the node, mounted read-only at /models.",
                            required=("path",),
                            properties={
                                "path": Str(pattern="^/", max_length=4096),
                                "subPath": Str(
                                    description="Path inside the directory to the HF folder or .gguf file.",
                                    rules=(
                                        Rule(
                                            "!self.matches('(^|/)[.][.](/|$)')",
                                            "subPath must not contain '..'",
                                        ),
                                    ),
                                    pattern="^[^/]",
                                    max_length=4096,
                                ),
                            },
                        ),
                    },
                ),
                "image": Str(
                    description="Worker image; default is the operator's CPU or GPU worker image.",
                    min_length=1,
                ),
                "executor": Str(
                    description="torch runs the model; mock runs no model (deterministic tokens, real KV accounting).",
                    enum=EXECUTORS,
                    default_value="torch",
                ),
                "replicas": Int(minimum=0, format="int32", default_value=1),
                "resources": Obj(
                    properties={
                        "gpus": Int(
                            description="GPUs per pod (of gpuResource). More than one splits the model over them with tensor parallelism (the worker's --tensor-parallel-size gpus: one rank process per GPU, NCCL between them; /dev/shm sized 1Gi per GPU unless shmSize says); the model's attention heads and intermediate sizes must divide by it (the worker refuses it at start otherwise).",
                            minimum=0,
                            maximum=8,
                            default_value=0,
                        ),
                        "nodes": Int(
                            description="Reserved: nodes one replica spans (only 1 today). A model larger than one node would be served by LeaderWorkerSet groups of this many pods, tensor parallel within a node and pipeline parallel across nodes (docs/tensor-parallel.md).",
                            minimum=1,
                            maximum=1,
                        ),
                        "gpuResource": Str(
                            description="The device plugin's resource a GPU is asked for as: nvidia.com/gpu (default), amd.com/gpu, a MIG slice such as nvidia.com/mig-1g.10gb, or another extended resource (DOMAIN/NAME). The pods tolerate a NoSchedule taint of that name (and of nvidia.com/gpu for nvidia.com/*).",
                            rules=(
                                Rule(
                                    "!self.matches('^[^/]*kubernetes[.]io/')",
                                    "gpuResource must be a device plugin's extended resource, not in kubernetes.io",
                                ),
                            ),
                            pattern="^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
                            max_length=253,
                            default_value=c.GPU_RESOURCE,
                        ),
                        "cpu": Quantity(description="CPU request per pod (default 1, or 4 with a GPU)."),
                        "memory": Quantity(
                            description="Memory request and limit per pod (default 4Gi, or 24Gi with a GPU).",
                        ),
                    },
                ),
                "adapters": Arr(
                    description="LoRA adapters (PEFT folders) the workers serve beside the model: a request's model names one (docs/kubernetes.md). hf:// and s3:// adapters need model.cache: one download Job each fetches them into it (with credentialsSecret), and the workers read them there; a pvc:// adapter must be on the cache's claim or model.pvc's, which the workers mount already. The list reaches the workers through a ConfigMap they watch: adding or removing an adapter never restarts a worker (only giving this field for the first time does, to turn LoRA on: give adapters: [] up front to avoid that). status.adapters shows each one's phase.",
                    max_items=MAX_ADAPTERS,
                    list_map_keys=("name",),
                    items=Obj(
                        required=("name", "url"),
                        properties={
                            "name": Str(
                                description="The served name: what a request's model says (not the model's own name).",
                                pattern=ADAPTER_NAME.pattern,
                                max_length=128,
                            ),
                            "url": Str(
                                description="Where the adapter is: hf://ORG/NAME[@REVISION], s3://BUCKET/PREFIX or pvc://CLAIM/PATH.",
                                rules=URL_RULES,
                                max_length=4096,
                            ),
                        },
                    ),
                ),
                "engine": Obj(
                    description="Worker engine options; unset ones keep the worker's defaults.",
                    properties={
                        "extraArgs": Arr(
                            description='More hetero-infer serve flags, as given (e.g. ["--enable-prefix-caching", "--seed", "7"]), for what this CRD does not model. The operator checks them against the worker\'s options: an unknown flag or bad value, a flag it sets itself or one of this object\'s fields, and secrets are refused.',
                            max_items=64,
                            items=Str(max_length=4096),
                        ),
                        "blockSize": Int(minimum=1, maximum=256),
                        "maxNumSeqs": Int(minimum=1),
                        "maxModelLen": Int(minimum=1),
                        "maxNumBatchedTokens": Int(minimum=1),
                        "dtype": Str(enum=DTYPES),
                        "quantization": Str(enum=QUANTIZATIONS),
                        "memoryThreshold": Num(minimum=0, exclusive_minimum=True, maximum=1),
                        "gpuMemoryUtilization": Num(minimum=0, exclusive_minimum=True, maximum=1),
                        "maxLoras": Int(
                            description="LoRA adapters one engine step can run (device slots; --max-loras, default 1). With adapters.",
                            minimum=1,
                        ),
                        "maxLoraRank": Int(
                            description="The largest LoRA rank an adapter may have (--max-lora-rank, default 16). With adapters.",
                            minimum=1,
                            maximum=MAX_LORA_RANK,
                        ),
                        "maxCpuLoras": Int(
                            description="LoRA adapters kept read in host memory (--max-cpu-loras, default maxLoras). With adapters.",
                            minimum=1,
                        ),
                        "kvOffloadingSize": Num(
                            description="GiB of host memory for a second KV tier behind the device pool (--kv-offloading-size): evicted prefixes are restored instead of recomputed. Counted in the pod's memory: added to the default, or held by spec.resources.memory when that is given.",
                            minimum=0,
                            exclusive_minimum=True,
                        ),
                    },
                ),
                "autoscaling": Obj(
                    rules=(
                        Rule(
                            "!has(self.maxReplicas) || self.minReplicas <= self.maxReplicas",
                            "minReplicas must not be greater than maxReplicas",
                        ),
                        Rule(
                            "!self.enabled || has(self.maxReplicas)",
                            "maxReplicas is required when autoscaling is enabled",
                        ),
                    ),
                    properties={
                        "enabled": Bool(default_value=False),
                        "mode": Str(
                            description="operator (the default): the operator scrapes every ready worker's /metrics each intervalSeconds and sets spec.replicas itself (no metrics adapter needed). hpa: the operator writes an autoscaling/v2 HPA that scales this resource through its scale subresource on the workers' metrics (needs a custom-metrics adapter).",
                            enum=("operator", "hpa"),
                            default_value="operator",
                        ),
                        "minReplicas": Int(
                            description="0 scales to zero: needs router.enabled and mode operator; the router holds requests while no worker is ready and sets this resource's scale from 0 to 1 as soon as it holds one (the operator's next pass does, if the router cannot).",
                            minimum=0,
                            format="int32",
                            default_value=1,
                        ),
                        "maxReplicas": Int(minimum=1, format="int32"),
                        "targetKVCacheUsage": Num(
                            description="Target average KV-cache usage per worker, in (0, 1].",
                            minimum=0,
                            exclusive_minimum=True,
                            maximum=1,
                            default_value=0.8,
                        ),
                        "targetQueueDepth": Num(
                            description="Target average number of waiting requests per worker.",
                            minimum=0,
                            exclusive_minimum=True,
                            default_value=5,
                        ),
                        "scaleUpStabilizationSeconds": Int(minimum=0, maximum=3600, default_value=0),
                        "scaleDownStabilizationSeconds": Int(minimum=0, maximum=3600, default_value=300),
                        "intervalSeconds": Int(
                            description='How often the operator evaluates metrics in mode "operator".',
                            minimum=1,
                            maximum=3600,
                            default_value=15,
                        ),
                        "scaleToZeroAfterSeconds": Int(
                            description="With minReplicas 0: scale to zero after this long without a request (none running, waiting, held or routed at any pass).",
                            minimum=0,
                            maximum=86400,
                            default_value=600,
                        ),
                    },
                ),
                "rollout": Obj(
                    description="How the worker Deployment replaces its pods when the spec changes. Without maxSurge and maxUnavailable the operator picks by pool: with gpus > 0 maxSurge 0, maxUnavailable 1 (a full GPU pool has no room for a surge pod, so one old pod goes first); on CPU maxSurge 1, maxUnavailable 0. Giving one of them keeps the other from ever making both 0.",
                    rules=(
                        Rule(
                            "!has(self.strategy) || self.strategy != 'Recreate' || (!has(self.maxSurge) && !has(self.maxUnavailable))",
                            "maxSurge and maxUnavailable apply to strategy RollingUpdate only",
                        ),
                    ),
                    properties={
                        "strategy": Str(
                            description="RollingUpdate: replace pods a few at a time. Recreate: stop all, then start all.",
                            enum=("RollingUpdate", "Recreate"),
                            default_value="RollingUpdate",
                        ),
                        "maxSurge": IntOrStr(
                            description="Pods above spec.replicas during a rolling update (a number or a percentage).",
                            rules=(
                                Rule(
                                    "string(self).matches('^[0-9]+%?$')",
                                    "must be a non-negative integer or a percentage such as 25%",
                                ),
                            ),
                        ),
                        "maxUnavailable": IntOrStr(
                            description="Pods below spec.replicas during a rolling update (a number or a percentage).",
                            rules=(
                                Rule(
                                    "string(self).matches('^[0-9]+%?$')",
                                    "must be a non-negative integer or a percentage such as 25%",
                                ),
                            ),
                        ),
                    },
                ),
                "service": Obj(
                    rules=(
                        Rule(
                            "!has(self.loadBalancerClass) || (has(self.type) && self.type == 'LoadBalancer')",
                            "service.loadBalancerClass applies to type LoadBalancer only",
                        ),
                        Rule(
                            "!has(self.loadBalancerSourceRanges) || (has(self.type) && self.type == 'LoadBalancer')",
                            "service.loadBalancerSourceRanges applies to type LoadBalancer only",
                        ),
                    ),
                    properties={
                        "type": Str(
                            enum=("ClusterIP", "NodePort", "LoadBalancer"), default_value="ClusterIP"
                        ),
                        "port": Int(minimum=1, maximum=65535, default_value=80),
                        "annotations": Map(
                            description='Annotations on the Service users call, e.g. an internal cloud load balancer (service.beta.kubernetes.io/aws-load-balancer-scheme: internal, networking.gke.io/load-balancer-type: Internal, service.beta.kubernetes.io/azure-load-balancer-internal: "true").',
                        ),
                        "loadBalancerClass": Str(
                            description="The load balancer implementation (type LoadBalancer), e.g. service.k8s.aws/nlb.",
                            pattern="^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
                            max_length=253,
                        ),
                        "loadBalancerSourceRanges": Arr(
                            description="CIDRs allowed through the load balancer (type LoadBalancer).",
                            max_items=64,
                            items=Str(max_length=64),
                        ),
                        "ingress": Obj(
                            description="An Ingress (networking.k8s.io/v1) to the Service users call, for clusters whose HTTP entry is an ingress controller.",
                            properties={
                                "className": Str(
                                    description="The IngressClass (e.g. nginx); unset: the cluster's default class.",
                                    pattern=DNS1123_SUBDOMAIN_PATTERN,
                                    max_length=253,
                                ),
                                "host": Str(
                                    description="The host name it answers for; unset: any host.",
                                    pattern=HOSTNAME_PATTERN,
                                    max_length=253,
                                ),
                                "path": Str(pattern="^/", max_length=1024, default_value="/"),
                                "annotations": Map(description="Annotations on the Ingress (the controller's options)."),
                                "tlsSecretName": Str(
                                    description="A Secret of type kubernetes.io/tls in the namespace: TLS for host.",
                                    pattern=DNS1123_SUBDOMAIN_PATTERN,
                                    max_length=253,
                                ),
                            },
                        ),
                        "httpRoute": Obj(
                            description="An HTTPRoute (Gateway API, gateway.networking.k8s.io/v1) from the given Gateways to the Service users call.",
                            required=("parentRefs",),
                            properties={
                                "parentRefs": Arr(
                                    min_items=1,
                                    max_items=32,
                                    items=Obj(
                                        required=("name",),
                                        properties={
                                            "name": Str(pattern=DNS1123_SUBDOMAIN_PATTERN, max_length=253),
                                            "namespace": Str(pattern=DNS1123_SUBDOMAIN_PATTERN, max_length=63),
                                            "sectionName": Str(pattern=DNS1123_SUBDOMAIN_PATTERN, max_length=253),
                                        },
                                    ),
                                ),
                                "hostnames": Arr(
                                    max_items=16,
                                    items=Str(
                                        pattern=HOSTNAME_PATTERN,
                                        max_length=253,
                                    ),
                                ),
                                "path": Str(pattern="^/", max_length=1024, default_value="/"),
                            },
                        ),
                    },
                ),
                "router": Obj(
                    description="hetero-infer router in front of the workers: one endpoint with cache-aware routing that holds requests while no worker is ready (scale from zero). The Service users call (the InferenceDeployment's name) then selects the router; the workers get <name>-workers, whose EndpointSlices the router watches.",
                    properties={
                        "enabled": Bool(default_value=False),
                        "replicas": Int(
                            description="Router pods; with two or more (the default) its PodDisruptionBudget keeps one serving through a node drain. With one there is no budget (none could keep the only router up): a drain of its node takes the endpoint offline until it is rescheduled.",
                            minimum=1,
                            format="int32",
                            default_value=2,
                        ),
                        "policy": Str(
                            description="prefix: the worker holding the longest cached prefix (bounded load); least-load; round-robin.",
                            enum=ROUTER_POLICIES,
                            default_value=ROUTER_DEFAULTS.policy,
                        ),
                        "image": Str(
                            description="Router image; default is the operator's router image (the operator image).",
                            min_length=1,
                        ),
                        "resources": Obj(
                            properties={
                                "cpu": Quantity(description="CPU request of a router pod (default 500m)."),
                                "memory": Quantity(
                                    description="Memory request and limit of a router pod (default 512Mi)."
                                ),
                            },
                        ),
                        "nodeSelector": Map(description="Where the router pods run."),
                        "tolerations": Arr(
                            max_items=32,
                            items=TOLERATION,
                        ),
                        "affinity": Free(
                            description="A core/v1 Affinity for the router pods; default, a preferred pod anti-affinity on kubernetes.io/hostname, so that the replicas spread over nodes.",
                        ),
                        "topologySpreadConstraints": Arr(
                            description="core/v1 TopologySpreadConstraints for the router pods (e.g. across zones).",
                            max_items=8,
                            items=SPREAD_CONSTRAINT,
                        ),
                        "priorityClassName": NAME(),
                        "podAnnotations": Map(),
                        "podLabels": pod_labels(None, "router.podLabels must not set the labels the operator sets"),
                        "holdTimeoutSeconds": Int(
                            description="How long a request waits for a ready worker before a 503 with Retry-After.",
                            minimum=1,
                            maximum=3600,
                            default_value=300,
                        ),
                        "tokenizer": Str(
                            description="Where the router's tokenizer for exact prefix hashes comes from: workers (fetched from the workers' GET /v1/tokenizer/files) or none (hash chunks of the prompt text: approximate).",
                            enum=ROUTER_TOKENIZERS,
                            default_value=ROUTER_DEFAULTS.tokenizer,
                        ),
                        "cors": Obj(
                            description="Cross-origin requests from browsers to the router (the Service users call): the router's --allowed-origins, --allowed-methods, --allowed-headers and --allow-credentials. CORS is off without allowedOrigins; requests that change something with a foreign Origin get 403.",
                            rules=(
                                Rule(
                                    "!has(self.allowCredentials) || !self.allowCredentials || !has(self.allowedOrigins) || !self.allowedOrigins.exists(o, o == '*')",
                                    'allowCredentials cannot be combined with allowedOrigins "*" (list the origins)',
                                ),
                            ),
                            properties={
                                "allowedOrigins": Arr(
                                    description='Origins allowed to call the router from a browser, such as https://app.example.com, or "*" for any.',
                                    max_items=64,
                                    items=Str(pattern="^\\*$|://", max_length=256),
                                ),
                                "allowedMethods": Arr(
                                    description='Methods allowed to those origins ("*" for any).',
                                    min_items=1,
                                    max_items=16,
                                    default_value=list(ROUTER_DEFAULTS.allowed_methods),
                                    items=Str(pattern="\\S", max_length=32),
                                ),
                                "allowedHeaders": Arr(
                                    description='Request headers allowed to those origins ("*" for any).',
                                    min_items=1,
                                    max_items=64,
                                    default_value=list(ROUTER_DEFAULTS.allowed_headers),
                                    items=Str(pattern="\\S", max_length=256),
                                ),
                                "allowCredentials": Bool(
                                    description='Let those origins send credentials (cookies, Authorization); not with "*".',
                                    default_value=False,
                                ),
                            },
                        ),
                        "apiKey": Obj(
                            description="A key the router's own clients must present (Authorization: Bearer) on /v1/*, from a Secret; their requests then reach the workers with spec.apiKey. Without it the router checks nothing and passes each client's Authorization header on to the workers.",
                            required=("secretKeyRef",),
                            properties={
                                "secretKeyRef": SECRET_KEY_REF,
                            },
                        ),
                        "flowControl": Obj(
                            description="The router's flow control (--flow-control): it runs no more at once on a worker than its max_num_seqs and queues the rest itself, per request priority (the request's priority field, lower first) and per tenant (tenantHeader, else the router API key presented), tenants of one priority served in turn, and sheds the lowest priority first with 429 + Retry-After when its queue is full.",
                            properties={
                                "enabled": Bool(default_value=False),
                                "maxQueued": Int(
                                    description="Requests queued at the router beyond the workers' slots (--max-queued).",
                                    minimum=0,
                                    maximum=100000,
                                    default_value=ROUTER_DEFAULTS.max_queued,
                                ),
                                "queueTimeoutSeconds": Int(
                                    description="The longest wait in the router's queue before a 429 (--queue-timeout-s).",
                                    minimum=1,
                                    maximum=3600,
                                    default_value=int(ROUTER_DEFAULTS.queue_timeout_s),
                                ),
                                "tenantHeader": Str(
                                    description="A request header naming the tenant, trusted: set it only where a gateway in front sets it (--tenant-header).",
                                    pattern=HEADER_NAME_PATTERN,
                                    max_length=128,
                                ),
                                "priorityClasses": Arr(
                                    description="Named priority classes (--priority-class): a request that gives no priority of its own and names one in priorityClassHeader takes its priority (lower first); an unknown name is a 400.",
                                    max_items=64,
                                    list_map_keys=("name",),
                                    items=Obj(
                                        required=("name", "priority"),
                                        properties={
                                            "name": Str(pattern="^[A-Za-z0-9][-A-Za-z0-9_.]*$", max_length=63),
                                            "priority": Int(minimum=-1000000, maximum=1000000),
                                        },
                                    ),
                                ),
                                "priorityClassHeader": Str(
                                    description="The request header naming a priority class, trusted as tenantHeader is (--priority-class-header); required with priorityClasses.",
                                    pattern=HEADER_NAME_PATTERN,
                                    max_length=128,
                                ),
                                "tenantLimits": Arr(
                                    description="Per-tenant limits (--tenant-limit): the most requests of a tenant in flight at once over every model; its others wait in the queue while other tenants take their turns.",
                                    max_items=256,
                                    list_map_keys=("tenant",),
                                    items=Obj(
                                        required=("tenant", "maxInFlight"),
                                        properties={
                                            "tenant": Str(pattern="^[^=,]+$", max_length=128),
                                            "maxInFlight": Int(minimum=1, maximum=100000),
                                        },
                                    ),
                                ),
                            },
                            rules=(
                                Rule(
                                    "!has(self.priorityClasses) || size(self.priorityClasses) == 0 || has(self.priorityClassHeader)",
                                    "flowControl.priorityClasses needs flowControl.priorityClassHeader",
                                ),
                            ),
                        ),
                        "inferencePool": Obj(
                            description="Also render an InferencePool (inference.networking.k8s.io/v1, Gateway API Inference Extension) over the worker pods, for a gateway whose endpoint picker routes to them.",
                            required=("endpointPicker",),
                            properties={
                                "endpointPicker": Str(
                                    description="The endpoint picker (EPP) Service's name.",
                                    pattern="^[a-z]([-a-z0-9]*[a-z0-9])?$",
                                    max_length=63,
                                ),
                                "endpointPickerPort": Int(minimum=1, maximum=65535, default_value=9002),
                            },
                        ),
                    },
                ),
                "apiKey": Obj(
                    description="The workers' API key, from a Secret in this namespace: the workers require it (Authorization: Bearer) on /v1/*, and the router sends it on its own requests to them (block reports, the tokenizer).",
                    required=("secretKeyRef",),
                    properties={
                        "secretKeyRef": SECRET_KEY_REF,
                    },
                ),
                "imagePullSecrets": Arr(
                    description="Secrets for pulling the worker and router images.",
                    max_items=16,
                    items=Obj(
                        required=("name",),
                        properties={
                            "name": NAME(),
                        },
                    ),
                ),
                "serviceAccountName": Str(
                    description="The worker pods' ServiceAccount (default the namespace's default one; its token is not mounted).",
                    pattern=DNS1123_SUBDOMAIN_PATTERN,
                    max_length=253,
                ),
                "priorityClassName": Str(
                    description="The worker pods' PriorityClass.",
                    pattern=DNS1123_SUBDOMAIN_PATTERN,
                    max_length=253,
                ),
                "runtimeClassName": Str(
                    description="The worker pods' RuntimeClass (e.g. nvidia).",
                    pattern=DNS1123_SUBDOMAIN_PATTERN,
                    max_length=253,
                ),
                "topologySpreadConstraints": Arr(
                    description="core/v1 TopologySpreadConstraints for the worker pods (their labelSelector is yours to give).",
                    max_items=8,
                    items=SPREAD_CONSTRAINT,
                ),
                "podAnnotations": Map(description="Extra annotations on the worker pods."),
                "podLabels": pod_labels("Extra labels on the worker pods (not the ones the operator selects them by).", "podLabels must not set the labels the operator sets (it selects the pods by them)"),
                "volumes": Arr(
                    description="Extra core/v1 Volumes for the worker pods (mounted with volumeMounts).",
                    max_items=32,
                    items=extra_volume(OWN_VOLUMES),
                ),
                "volumeMounts": Arr(
                    description="Extra core/v1 VolumeMounts for the worker container, of spec.volumes.",
                    max_items=32,
                    items=extra_mount(OWN_MOUNT_PATHS),
                ),
                "startupTimeoutSeconds": Int(
                    description="How long a worker may take to start (load its model) before it is restarted.",
                    minimum=10,
                    maximum=86400,
                    default_value=900,
                ),
                "drainSeconds": Int(
                    description="On scale-down, rollout or drain: how long a worker still finishes its running requests after it has left the endpoints (its --shutdown-grace).",
                    minimum=0,
                    maximum=86400,
                    default_value=45,
                ),
                "terminationGracePeriodSeconds": Int(
                    description="The worker pods' grace period; at least drainSeconds + 10 (the preStop). Default drainSeconds + 15.",
                    minimum=0,
                    maximum=86400,
                ),
                "jsonPatches": Arr(
                    description='RFC 6902 JSON patch operations applied to the worker pod template ({metadata, spec}) after the operator rendered it: the escape hatch for what this CRD does not model, e.g. {op: add, path: /spec/containers/0/env/-, value: {name: X, value: "1"}}. One that does not apply marks the resource Degraded (InvalidSpec) and changes nothing.',
                    max_items=64,
                    items=Obj(
                        rules=(
                            Rule(
                                "!(self.op in ['add', 'replace', 'test']) || has(self.value)",
                                "jsonPatches add, replace and test need a value",
                            ),
                            Rule(
                                "!(self.op in ['move', 'copy']) || has(self.from)",
                                "jsonPatches move and copy need from",
                            ),
                        ),
                        required=("op", "path"),
                        properties={
                            "op": Str(enum=("add", "remove", "replace", "move", "copy", "test")),
                            "path": Str(pattern="^(/.*)?$"),
                            "from": Str(),
                            "value": Free(object=False),
                        },
                    ),
                ),
                "shmSize": Quantity(
                    description="The size of the worker's /dev/shm (a memory-backed emptyDir; counts against its memory). Default 1Gi per GPU (at least 1Gi): the tensor-parallel ranks' collectives use it.",
                ),
                "probes": Obj(
                    description="The worker's liveness (/healthz: fails once its engine died, so the kubelet restarts it) and readiness (/readyz) probes. Defaults: liveness every 10 s, 3 s time-out, 3 failures; readiness every 5 s, 3 s time-out, 2 failures. The startup window is startupTimeoutSeconds.",
                    properties={
                        "liveness": probe_tuning("liveness", DEFAULT_LIVENESS.period_seconds),
                        "readiness": probe_tuning("readiness", DEFAULT_READINESS.period_seconds),
                    },
                ),
                "podSecurityContext": Free(
                    description="A core/v1 PodSecurityContext for the worker, router and download pods instead of the operator's (runAsUser/runAsGroup/fsGroup 10001): e.g. {} on OpenShift, whose restricted SCC assigns UIDs per namespace. runAsNonRoot true and seccompProfile RuntimeDefault are filled in where it says nothing; what the restricted Pod Security Standard forbids is refused.",
                    rules=(
                        Rule(
                            "!has(self.runAsNonRoot) || self.runAsNonRoot",
                            "podSecurityContext.runAsNonRoot must not be false (restricted)",
                        ),
                        Rule(
                            "!has(self.runAsUser) || self.runAsUser != 0",
                            "podSecurityContext.runAsUser must not be 0 (restricted)",
                        ),
                    ),
                ),
                "securityContext": Free(
                    description="core/v1 SecurityContext fields for the worker and download containers, over the operator's (allowPrivilegeEscalation false, readOnlyRootFilesystem, runAsNonRoot, drop ALL); what the restricted Pod Security Standard forbids is refused.",
                    rules=(
                        Rule(
                            "!has(self.privileged) || !self.privileged",
                            "securityContext.privileged must not be true (restricted)",
                        ),
                        Rule(
                            "!has(self.allowPrivilegeEscalation) || !self.allowPrivilegeEscalation",
                            "securityContext.allowPrivilegeEscalation must not be true (restricted)",
                        ),
                        Rule(
                            "!has(self.runAsNonRoot) || self.runAsNonRoot",
                            "securityContext.runAsNonRoot must not be false (restricted)",
                        ),
                        Rule(
                            "!has(self.runAsUser) || self.runAsUser != 0",
                            "securityContext.runAsUser must not be 0 (restricted)",
                        ),
                    ),
                ),
                "nodeSelector": Map(),
                "tolerations": Arr(
                    items=TOLERATION,
                ),
                "affinity": Free(description="A core/v1 Affinity for the worker pods."),
                "env": Arr(
                    description="Extra environment variables for the worker (e.g. HETERO_INFER_* engine options).",
                    items=Obj(
                        rules=(
                            Rule(
                                "!(has(self.value) && has(self.valueFrom))",
                                "give value or valueFrom, not both",
                            ),
                        ),
                        required=("name",),
                        properties={
                            "name": Str(pattern="^[-._a-zA-Z][-._a-zA-Z0-9]*$"),
                            "value": Str(),
                            "valueFrom": Free(),
                        },
                    ),
                ),
            },
        ),
        "status": Obj(
            properties={
                "replicas": Int(format="int32"),
                "readyReplicas": Int(format="int32"),
                "desiredReplicas": Int(format="int32"),
                "selector": Str(),
                "observedGeneration": Int(format="int64"),
                "endpoint": Str(),
                "model": Obj(
                    description="The download of spec.model.url into spec.model.cache (only with a cache); the ModelReady condition says more.",
                    properties={
                        "url": Str(),
                        "phase": Str(enum=("Pending", "Downloading", "Ready", "Failed")),
                    },
                ),
                "adapters": Arr(
                    description="Each LoRA adapter of spec.adapters: Pending, Downloading (into model.cache), Ready (the workers load it) or Failed (message says why); loadedReplicas: the ready worker pods that serve it (read from their /metrics at each reconcile pass).",
                    list_map_keys=("name",),
                    items=Obj(
                        required=("name",),
                        properties={
                            "name": Str(),
                            "url": Str(),
                            "phase": Str(enum=("Pending", "Downloading", "Ready", "Failed")),
                            "reason": Str(),
                            "message": Str(),
                            "loadedReplicas": Int(format="int32"),
                        },
                    ),
                ),
                "router": Obj(
                    description="The router Deployment (only with spec.router.enabled); the RouterReady condition says whether it serves.",
                    properties={
                        "replicas": Int(format="int32"),
                        "readyReplicas": Int(format="int32"),
                        "updatedReplicas": Int(format="int32"),
                        "availableReplicas": Int(format="int32"),
                        "policy": Str(),
                    },
                ),
                "lastScaleTime": Str(format="date-time"),
                "metrics": Obj(
                    properties={
                        "kvCacheUsage": Num(),
                        "queueDepth": Num(),
                        "time": Str(format="date-time"),
                    },
                ),
                "conditions": Arr(
                    list_map_keys=("type",),
                    items=Obj(
                        required=("type", "status"),
                        properties={
                            "type": Str(),
                            "status": Str(enum=("True", "False", "Unknown")),
                            "reason": Str(),
                            "message": Str(),
                            "lastTransitionTime": Str(format="date-time"),
                            "observedGeneration": Int(format="int64"),
                        },
                    ),
                ),
            },
        ),
    },
)

# Everything else of the CRD: names, subresources, printer columns.
VERSION: dict[str, Any] = {
    "name": "v1alpha1",
    "served": True,
    "storage": True,
    "subresources": {
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        },
    },
    "additionalPrinterColumns": [
        {"name": "Model", "type": "string", "jsonPath": ".spec.model.name"},
        {
            "name": "Replicas",
            "type": "integer",
            "description": "Requested worker replicas",
            "jsonPath": ".spec.replicas",
        },
        {
            "name": "Ready",
            "type": "integer",
            "description": "Worker replicas that pass their readiness probe",
            "jsonPath": ".status.readyReplicas",
        },
        {
            "name": "Status",
            "type": "string",
            "description": "Why the Ready condition is what it is (with spec.router, "
            "Ready needs the router too)",
            "jsonPath": '.status.conditions[?(@.type=="Ready")].reason',
        },
        {
            "name": "KV-Usage",
            "type": "number",
            "description": "Average KV-cache usage (0..1) last observed",
            "jsonPath": ".status.metrics.kvCacheUsage",
        },
        {
            "name": "Queue",
            "type": "number",
            "description": "Average number of waiting requests per worker last observed",
            "jsonPath": ".status.metrics.queueDepth",
        },
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        {"name": "Executor", "type": "string", "priority": 1, "jsonPath": ".spec.executor"},
        {"name": "Endpoint", "type": "string", "priority": 1, "jsonPath": ".status.endpoint"},
        {
            "name": "Router",
            "type": "integer",
            "priority": 1,
            "description": "Router replicas available (spec.router.enabled)",
            "jsonPath": ".status.router.availableReplicas",
        },
        {
            "name": "Download",
            "type": "string",
            "priority": 1,
            "description": "spec.model.cache: the download's phase (Pending, "
            "Downloading, Ready, Failed; ModelReady says more)",
            "jsonPath": ".status.model.phase",
        },
    ],
}

HEADER = """\
# GENERATED from operator/crd.py (python -m hetero_infer.operator.crd): edit that, not this file.
# InferenceDeployment: one served model = a set of hetero-infer worker pods behind a Service.
# The operator (`hetero-infer operator`) reconciles it into a Deployment, a Service, a
# PodDisruptionBudget and, in autoscaling mode "hpa", a HorizontalPodAutoscaler.
# The same file ships in charts/hetero-infer/crds/.
"""
ROOT = Path(__file__).resolve().parents[1]
FILES = (ROOT / "crds" / f"{c.CRD_NAME}.yaml", ROOT / "charts" / "hetero-infer" / "crds" / f"{c.CRD_NAME}.yaml")


def crd() -> dict[str, Any]:
    """The CustomResourceDefinition object."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": c.CRD_NAME, "labels": {c.LABEL_NAME: c.APP_NAME, c.LABEL_COMPONENT: "crd"}},
        "spec": {
            "group": c.GROUP,
            "scope": "Namespaced",
            "names": {"kind": c.KIND, "listKind": f"{c.KIND}List", "plural": c.PLURAL, "singular": c.SINGULAR,
                      "shortNames": [c.SHORT_NAME], "categories": ["all", c.APP_NAME]},
            "versions": [{**VERSION, "schema": {"openAPIV3Schema": SCHEMA.openapi()}}],
        },
    }


def render() -> str:
    """The CRD file's text, as committed in crds/ and the chart."""
    return HEADER + yaml.safe_dump(crd(), sort_keys=False, width=120, allow_unicode=True)


def main(argv: list[str] | None = None) -> int:
    """Write the CRD files (--check: only say whether they are current; status 1 if not)."""
    args = sys.argv[1:] if argv is None else argv
    text = render()
    stale = [p for p in FILES if not p.is_file() or p.read_text() != text]
    if "--check" in args:
        for p in stale:
            print(f"{p.relative_to(ROOT)} is not what operator/crd.py generates: run python -m hetero_infer.operator.crd")
        return 1 if stale else 0
    for p in stale:
        p.write_text(text)
        print(f"wrote {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

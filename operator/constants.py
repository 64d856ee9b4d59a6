"""Names shared by the CRD, the manifests and the handlers (the Kubernetes contract)."""

from __future__ import annotations

from hetero_infer.contracts import metric_names as _metrics
from hetero_infer.contracts.kube import API_VERSION, GROUP, KIND, PLURAL, VERSION  # noqa: F401  (the router's too)

SINGULAR = "inferencedeployment"
SHORT_NAME = "infd"
CRD_NAME = f"{PLURAL}.{GROUP}"

# Labels on every child; the first two select the worker pods.
LABEL_OWNER = f"{GROUP}/inference-deployment"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "hetero-infer-operator"
COMPONENT_WORKER = "worker"
COMPONENT_ROUTER = "router"
COMPONENT_MODEL_CACHE = "model-cache"  # spec.model.cache: the claim the operator creates and the download Job
APP_NAME = "hetero-infer"

# On every child: a hash of the manifest the operator last wrote it from (diff.py).
FINGERPRINT_ANNOTATION = f"{GROUP}/manifest-hash"
# On a child with keys from the spec in a map (the worker pods' podLabels, podAnnotations, nodeSelector):
# which keys the operator wrote there, by path, so that one dropped from the spec is removed (diff.merge_patch).
SPEC_KEYS_ANNOTATION = f"{GROUP}/spec-keys"

# On the Service users call: the optional children the operator rendered with it (router, inference-pool), so a
# pass that no longer wants them knows what to delete without looking for each.
OPTIONAL_CHILDREN_ANNOTATION = f"{GROUP}/optional-children"
OPTIONAL_ROUTER = "router"
OPTIONAL_INFERENCE_POOL = "inference-pool"
OPTIONAL_INGRESS = "ingress"
OPTIONAL_HTTP_ROUTE = "httproute"

# On the worker Deployment with spec.model.cache: the cache folder (manifests.common.cache_key) its pods read, so a
# pass whose new revision is not downloaded yet keeps the workers on the one they serve.
MODEL_CACHE_KEY_ANNOTATION = f"{GROUP}/model-cache-key"
# On a download Job: the url it fetches (what status.model reports while it runs).
MODEL_URL_ANNOTATION = f"{GROUP}/model-url"
# On a download Job: the claim it writes into (with the cache key: which Job an InferenceDeployment on a shared claim
# may wait on though another one created it).
MODEL_CACHE_CLAIM_ANNOTATION = f"{GROUP}/model-cache-claim"

# On a LoRA adapter's download Job (spec.adapters): the adapter's name.
ADAPTER_ANNOTATION = f"{GROUP}/lora-adapter"
# spec.adapters: the ConfigMap NAME-adapters lists the adapters ready to serve (its key ADAPTERS_KEY: a JSON list of
# {"name", "path"}); the workers mount it at ADAPTERS_CONFIG_DIR and follow it (--lora-modules-file), so adding or
# removing an adapter changes the ConfigMap, never the pods. hf:// and s3:// adapters are read from the cache claim,
# mounted whole at ADAPTERS_MOUNT.
ADAPTERS_SUFFIX = "-adapters"
ADAPTERS_KEY = "adapters.json"
ADAPTERS_CONFIG_DIR = "/etc/hetero-infer/lora"
ADAPTERS_MOUNT = "/model-cache"

# Annotation prefix for kopf's own bookkeeping (progress, last handled spec).
KOPF_ANNOTATION_PREFIX = f"operator.{GROUP}"

# The worker's HTTP port inside the pod (docs/contracts.md: worker HTTP contract).
WORKER_PORT = 3000
WORKER_PORT_NAME = "http"
GPU_RESOURCE = "nvidia.com/gpu"

# Worker metric names the HPA scales on (docs/contracts.md: the worker's metrics are a contract).
METRIC_KV_CACHE_USAGE = _metrics.KV_CACHE_USAGE
METRIC_REQUESTS_WAITING = _metrics.REQUESTS_WAITING
METRIC_REQUESTS_RUNNING = _metrics.REQUESTS_RUNNING

# Default worker images; the operator's --worker-image / --worker-gpu-image flags override them.
DEFAULT_WORKER_IMAGE = "ghcr.io/hetero-infer/worker:0.1.0-cpu"
DEFAULT_WORKER_GPU_IMAGE = "ghcr.io/hetero-infer/worker:0.1.0-cuda"
# The router needs no torch: the operator image carries it (`hetero-infer router`); --router-image overrides.
DEFAULT_ROUTER_IMAGE = "ghcr.io/hetero-infer/operator:0.1.0"

# The router's gauge of requests waiting for a ready worker (router/metrics.py): what scale-from-zero reads.
METRIC_ROUTER_REQUESTS_HELD = _metrics.ROUTER_REQUESTS_HELD
METRIC_ROUTER_IN_FLIGHT = _metrics.ROUTER_IN_FLIGHT
METRIC_ROUTER_ROUTED = _metrics.ROUTER_ROUTED + "_total"

# Condition types in status.conditions.
COND_READY = "Ready"
COND_PROGRESSING = "Progressing"
COND_DEGRADED = "Degraded"
COND_SCALING_ACTIVE = "ScalingActive"
COND_ROUTER_READY = "RouterReady"  # only with spec.router.enabled
COND_MODEL_READY = "ModelReady"  # only with spec.model.cache
CONDITION_TYPES = (COND_READY, COND_MODEL_READY, COND_ROUTER_READY, COND_PROGRESSING, COND_DEGRADED,
                   COND_SCALING_ACTIVE)

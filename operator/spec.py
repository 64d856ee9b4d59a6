"""InferenceDeployment spec: parsing, defaults and validation (pure functions, no Kubernetes calls).

The CRD's structural schema is the first line of defence; this module is the second, for specs that
slip past it (a CRD installed without validation, an older CRD version, a hand-made object). Both come from one
definition, operator/crd.py's SCHEMA: the allowed keys, types, bounds, enums and defaults read here are its own
(Reader.field / Reader.keys), and crds/ is generated from it. What a schema cannot say (cross-field rules, the
worker's flags, the CEL rules' Python twins) is checked here, and every problem is reported at once with the
field's path, so the operator can put the message into a Degraded condition instead of failing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from typing import Any

from hetero_infer.contracts import cors  # the router's and workers' CORS rules, not a copy
from hetero_infer.contracts.kube import WORKERS_SERVICE_SUFFIX  # the worker Service <name>-workers
from hetero_infer.contracts.lora_modules import ADAPTER_NAME_RULE
from hetero_infer.operator import crd
from hetero_infer.operator.crd import DOWNLOAD_OWN_MOUNT_PATHS, DOWNLOAD_OWN_VOLUMES, SCHEMA
from hetero_infer.operator.diff import parse_quantity
from hetero_infer.operator.spec_overrides import (
    OverridesSpec,
    parse_extra_args,
    parse_overrides,
)
from hetero_infer.operator.spec_pod import (
    PodSpec,
    SecretKeyRef,
    parse_labels,
    parse_name,
    parse_pod,
    parse_secret_key_ref,
    parse_spread,
    parse_volumes,
)
from hetero_infer.operator.spec_reader import (
    DNS1035,
    DNS1123_SUBDOMAIN,
    ENV_NAME,
    INT_OR_PERCENT,
    Reader,
    string_map,
    strings,
    type_name,
)


def _default(path: str) -> Any:
    return SCHEMA.at(path).default


# Defaults and enums: the CRD's (operator/crd.py), read from its one definition.
QUANTIZATIONS, ROUTER_POLICIES, ROUTER_TOKENIZERS = crd.QUANTIZATIONS, crd.ROUTER_POLICIES, crd.ROUTER_TOKENIZERS
AUTOSCALING_MODES = SCHEMA.at("spec.autoscaling.mode").enum
SERVICE_TYPES = SCHEMA.at("spec.service.type").enum
ROLLOUT_STRATEGIES = SCHEMA.at("spec.rollout.strategy").enum
DEFAULT_EXECUTOR = _default("spec.executor")
DEFAULT_REPLICAS = _default("spec.replicas")
DEFAULT_GPUS = _default("spec.resources.gpus")
DEFAULT_MIN_REPLICAS = _default("spec.autoscaling.minReplicas")
DEFAULT_MODE = _default("spec.autoscaling.mode")
DEFAULT_TARGET_KV_CACHE_USAGE = _default("spec.autoscaling.targetKVCacheUsage")
DEFAULT_TARGET_QUEUE_DEPTH = _default("spec.autoscaling.targetQueueDepth")
DEFAULT_SCALE_UP_STABILIZATION_SECONDS = _default("spec.autoscaling.scaleUpStabilizationSeconds")
DEFAULT_SCALE_DOWN_STABILIZATION_SECONDS = _default("spec.autoscaling.scaleDownStabilizationSeconds")
DEFAULT_INTERVAL_SECONDS = _default("spec.autoscaling.intervalSeconds")
DEFAULT_SCALE_TO_ZERO_AFTER_SECONDS = _default("spec.autoscaling.scaleToZeroAfterSeconds")
DEFAULT_ROUTER_REPLICAS = _default("spec.router.replicas")  # with its PDB, a node drain keeps one serving
DEFAULT_ROUTER_POLICY = _default("spec.router.policy")
DEFAULT_ROUTER_TOKENIZER = _default("spec.router.tokenizer")
DEFAULT_CORS_METHODS = tuple(_default("spec.router.cors.allowedMethods"))
DEFAULT_CORS_HEADERS = tuple(_default("spec.router.cors.allowedHeaders"))
# spec.router.cors bounds (the CRD's maxItems/maxLength): (max items, max characters per item)
CORS_LIMITS = {key: (SCHEMA.at(f"spec.router.cors.{key}").max_items,
                     SCHEMA.at(f"spec.router.cors.{key}").items.max_length)
               for key in ("allowedOrigins", "allowedMethods", "allowedHeaders")}
DEFAULT_HOLD_TIMEOUT_SECONDS = _default("spec.router.holdTimeoutSeconds")  # a worker's start from zero
DEFAULT_SERVICE_TYPE = _default("spec.service.type")
DEFAULT_SERVICE_PORT = _default("spec.service.port")
DEFAULT_ROLLOUT_STRATEGY = _default("spec.rollout.strategy")
# Rolling updates by pool: a GPU pool is usually full, so a surge pod would wait for a GPU that only the
# old pod frees (the rollout stalls); replace one pod at a time instead. CPU pods can surge.
DEFAULT_ROLLOUT = {True: (0, 1), False: (1, 0)}  # has a GPU -> (maxSurge, maxUnavailable)
MAX_GPUS = SCHEMA.at("spec.resources.gpus").maximum  # a worker's tensor-parallel ranks, one GPU each (one node)
# spec.model.url: the CRD's pattern (crds/), checked here too for clusters without CEL.
MODEL_URL = re.compile(
    r"^(hf://[A-Za-z0-9][-_.A-Za-z0-9]*(/[A-Za-z0-9][-_.A-Za-z0-9]*)?(@[^@ ]+)?"
    r"|s3://[a-z0-9][-.a-z0-9]{1,61}[a-z0-9](/.*)?"
    r"|pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?(/.*)?)$")
MODEL_URL_FORMS = "hf://ORG/NAME[@REVISION], s3://BUCKET/PREFIX or pvc://CLAIM/PATH"
DEFAULT_DOWNLOAD_SIZE = "20Gi"
DEFAULT_FETCH_BACKOFF_LIMIT = _default("spec.model.cache.download.backoffLimit")  # Kubernetes' default: ~10 min
# The cache claim's access modes: one download Job writes it (so a writable mode), then every worker reads it
# (ReadWriteMany, or ReadOnlyMany beside ReadWriteOnce on a volume that offers both, e.g. a GCE PD; ReadWriteOnce
# alone serves one replica).
DEFAULT_CACHE_ACCESS_MODES = ("ReadWriteMany",)
ACCESS_MODES = ("ReadWriteMany", "ReadWriteOnce", "ReadOnlyMany", "ReadWriteOncePod")
WRITABLE_ACCESS_MODES = ("ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod")
SHARED_ACCESS_MODES = ("ReadWriteMany", "ReadOnlyMany")  # what several workers on several nodes can mount
DEFAULT_GPU_RESOURCE = _default("spec.resources.gpuResource")
# An extended resource (a device plugin's): DOMAIN/NAME, not in kubernetes.io's namespaces. MIG slices are such
# names too (nvidia.com/mig-1g.10gb).
EXTENDED_RESOURCE = re.compile(r"^(?![^/]*kubernetes\.io/)[a-z0-9]([-a-z0-9.]*[a-z0-9])?/"
                               r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
# A Service's loadBalancerClass: a label-style key with a domain prefix (service.k8s.aws/nlb, io.cilium/bgp-control-plane)
LOAD_BALANCER_CLASS = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
CACHE_URL_SCHEMES = ("hf://", "s3://")  # what the download Job fetches into spec.model.cache
MAX_NAME_LENGTH = 63  # the name is also the Service's name: a DNS-1035 label
MAX_NAME_LENGTH_WITH_ROUTER = MAX_NAME_LENGTH - len(WORKERS_SERVICE_SUFFIX)


class SpecError(ValueError):
    """The spec cannot be honoured; `problems` lists every reason with the field's path."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class PvcSource:
    claim_name: str
    sub_path: str | None = None
    read_only: bool = True


@dataclass(frozen=True)
class HostPathSource:
    path: str
    sub_path: str | None = None


@dataclass(frozen=True)
class DownloadSpec:
    """spec.model.cache.download: where the download Job runs, as whom, with what (each only when given)."""

    image: str | None = None  # default: the operator's CPU worker image (a download needs no CUDA)
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()
    affinity: dict[str, Any] | None = None
    service_account_name: str | None = None  # e.g. IRSA / Workload Identity: credentials without static keys
    priority_class_name: str | None = None
    annotations: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    volumes: tuple[dict[str, Any], ...] = ()  # e.g. a private CA bundle (AWS_CA_BUNDLE, REQUESTS_CA_BUNDLE)
    volume_mounts: tuple[dict[str, Any], ...] = ()
    active_deadline_seconds: int | None = None
    backoff_limit: int = DEFAULT_FETCH_BACKOFF_LIMIT
    cpu: str | None = None
    memory: str | None = None


@dataclass(frozen=True)
class CacheSpec:
    """spec.model.cache: a ReadWriteMany volume the download Job fills once and the workers mount read-only;
    an existing claim (`claim_name`), or one the operator creates (`size`, `storage_class_name`)."""

    claim_name: str | None = None
    size: str | None = None
    storage_class_name: str | None = None  # None: the cluster's default class
    access_modes: tuple[str, ...] = DEFAULT_CACHE_ACCESS_MODES  # of the claim the operator creates
    volume_name: str | None = None  # bind the claim the operator creates to this PersistentVolume
    download: DownloadSpec = field(default_factory=DownloadSpec)


@dataclass(frozen=True)
class ModelSpec:
    name: str
    path: str | None = None
    pvc: PvcSource | None = None  # also from url pvc://CLAIM/PATH
    host_path: HostPathSource | None = None
    url: str | None = None  # hf://ORG/NAME[@REVISION] or s3://BUCKET/PREFIX: fetched by each pod's init container
    credentials_secret: str | None = None  # a Secret whose keys are the fetcher's environment (HF_TOKEN, AWS_...)
    download_size: str = DEFAULT_DOWNLOAD_SIZE  # the download emptyDir's sizeLimit and ephemeral-storage request
    cache: CacheSpec | None = None  # with a url: one download Job into this volume instead of each pod's


@dataclass(frozen=True)
class ResourcesSpec:
    gpus: int = DEFAULT_GPUS
    gpu_resource: str = DEFAULT_GPU_RESOURCE  # the device plugin's resource: amd.com/gpu, nvidia.com/mig-1g.10gb, ...
    cpu: str | None = None
    memory: str | None = None
    nodes: int = 1  # reserved: a replica on several nodes (LeaderWorkerSet groups; docs/tensor-parallel.md)


@dataclass(frozen=True)
class EngineSpec:
    """Engine options, named as EngineConfig's (hetero_infer.contracts.engine_options); None: the worker's default.
    In the order the worker's flags are rendered (manifests/worker.py): reordering them rolls every worker."""

    dtype: str | None = None
    quantization: str | None = None
    block_size: int | None = None
    max_num_seqs: int | None = None
    max_model_len: int | None = None
    max_num_batched_tokens: int | None = None
    memory_threshold: float | None = None
    gpu_memory_utilization: float | None = None
    kv_offloading_size: float | None = None  # GiB of host memory for the host KV tier, counted in the pod's memory
    # LoRA adapters' slots (spec.adapters turns LoRA on): None, the worker's defaults
    max_loras: int | None = None
    max_lora_rank: int | None = None
    max_cpu_loras: int | None = None


@dataclass(frozen=True)
class AdapterSpec:
    """One of spec.adapters: a LoRA adapter served as `name`, from `url` (hf://, s3:// or pvc://CLAIM/PATH)."""

    name: str
    url: str

    @property
    def downloaded(self) -> bool:
        """hf:// and s3:// adapters are downloaded into spec.model.cache by a Job; a pvc:// one is read in place."""
        return self.url.startswith(CACHE_URL_SCHEMES)

    @property
    def claim_path(self) -> tuple[str, str]:
        """(claim, path in it) of a pvc:// adapter."""
        claim, _, sub = self.url[len("pvc://"):].partition("/")
        return claim, sub.strip("/")


@dataclass(frozen=True)
class AutoscalingSpec:
    enabled: bool = False
    mode: str = DEFAULT_MODE
    min_replicas: int = DEFAULT_MIN_REPLICAS
    max_replicas: int | None = None
    target_kv_cache_usage: float = DEFAULT_TARGET_KV_CACHE_USAGE
    target_queue_depth: float = DEFAULT_TARGET_QUEUE_DEPTH
    scale_up_stabilization_seconds: int = DEFAULT_SCALE_UP_STABILIZATION_SECONDS
    scale_down_stabilization_seconds: int = DEFAULT_SCALE_DOWN_STABILIZATION_SECONDS
    interval_seconds: int = DEFAULT_INTERVAL_SECONDS
    scale_to_zero_after_seconds: int = DEFAULT_SCALE_TO_ZERO_AFTER_SECONDS  # with minReplicas 0 only

    @property
    def hpa(self) -> bool:
        return self.enabled and self.mode == "hpa"

    @property
    def by_operator(self) -> bool:
        """Mode operator: the operator's autoscaler sets spec.replicas and owns its part of the status."""
        return self.enabled and self.mode == "operator"


@dataclass(frozen=True)
class IngressSpec:
    class_name: str | None = None
    host: str | None = None
    path: str = "/"
    annotations: dict[str, str] = field(default_factory=dict)
    tls_secret_name: str | None = None


@dataclass(frozen=True)
class ParentRef:
    name: str
    namespace: str | None = None
    section_name: str | None = None


@dataclass(frozen=True)
class HTTPRouteSpec:
    parent_refs: tuple[ParentRef, ...]
    hostnames: tuple[str, ...] = ()
    path: str = "/"


@dataclass(frozen=True)
class ServiceSpec:
    type: str = DEFAULT_SERVICE_TYPE
    port: int = DEFAULT_SERVICE_PORT
    annotations: dict[str, str] = field(default_factory=dict)  # e.g. a cloud's internal load balancer
    load_balancer_class: str | None = None
    load_balancer_source_ranges: tuple[str, ...] = ()
    ingress: IngressSpec | None = None  # an Ingress to the Service users call (manifests/exposure.py)
    http_route: HTTPRouteSpec | None = None  # a Gateway API HTTPRoute to it


@dataclass(frozen=True)
class RouterPodSpec:
    """Where the router pods run and what they carry (each only when given; without an affinity, a preferred
    anti-affinity spreads the replicas over nodes)."""

    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()
    affinity: dict[str, Any] | None = None
    topology_spread_constraints: tuple[dict[str, Any], ...] = ()
    priority_class_name: str | None = None
    annotations: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RolloutSpec:
    """How the worker Deployment replaces pods; maxSurge/maxUnavailable resolved (None with Recreate)."""

    strategy: str = DEFAULT_ROLLOUT_STRATEGY
    max_surge: int | str | None = DEFAULT_ROLLOUT[False][0]
    max_unavailable: int | str | None = DEFAULT_ROLLOUT[False][1]


@dataclass(frozen=True)
class InferencePoolSpec:
    """A Gateway API Inference Extension InferencePool over the workers (for an existing inference gateway)."""

    endpoint_picker: str  # the endpoint picker (EPP) Service's name
    endpoint_picker_port: int = 9002


@dataclass(frozen=True)
class RouterFlowSpec:
    """spec.router.flowControl: the router's --flow-control and its limits (router/flow.py)."""

    enabled: bool = False
    max_queued: int = _default("spec.router.flowControl.maxQueued")
    queue_timeout_seconds: int = _default("spec.router.flowControl.queueTimeoutSeconds")
    tenant_header: str | None = None
    priority_classes: tuple[tuple[str, int], ...] = ()  # (name, priority)
    priority_class_header: str | None = None
    tenant_limits: tuple[tuple[str, int], ...] = ()  # (tenant, most requests in flight)


@dataclass(frozen=True)
class RouterCorsSpec:
    """The router's CORS options (hetero_infer/contracts/cors.py, the same as the workers'): off without origins."""

    allowed_origins: tuple[str, ...] = ()
    allowed_methods: tuple[str, ...] = DEFAULT_CORS_METHODS
    allowed_headers: tuple[str, ...] = DEFAULT_CORS_HEADERS
    allow_credentials: bool = False


@dataclass(frozen=True)
class RouterSpec:
    """`hetero-infer router` in front of the workers: the Service users call selects its pods."""

    enabled: bool = False
    replicas: int = DEFAULT_ROUTER_REPLICAS
    policy: str = DEFAULT_ROUTER_POLICY
    image: str | None = None
    cpu: str | None = None
    memory: str | None = None
    hold_timeout_seconds: int = DEFAULT_HOLD_TIMEOUT_SECONDS
    inference_pool: InferencePoolSpec | None = None
    cors: RouterCorsSpec = field(default_factory=RouterCorsSpec)
    tokenizer: str = DEFAULT_ROUTER_TOKENIZER
    api_key: SecretKeyRef | None = None  # the key the router's own clients must present
    pod: RouterPodSpec = field(default_factory=RouterPodSpec)
    flow: RouterFlowSpec = field(default_factory=RouterFlowSpec)


@dataclass(frozen=True)
class InferenceSpec:
    model: ModelSpec
    image: str | None = None
    executor: str = DEFAULT_EXECUTOR
    replicas: int = DEFAULT_REPLICAS
    resources: ResourcesSpec = field(default_factory=ResourcesSpec)
    engine: EngineSpec = field(default_factory=EngineSpec)
    autoscaling: AutoscalingSpec = field(default_factory=AutoscalingSpec)
    service: ServiceSpec = field(default_factory=ServiceSpec)
    rollout: RolloutSpec = field(default_factory=RolloutSpec)
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    affinity: dict[str, Any] | None = None
    env: list[dict[str, Any]] = field(default_factory=list)
    router: RouterSpec = field(default_factory=RouterSpec)
    pod: PodSpec = field(default_factory=PodSpec)
    api_key: SecretKeyRef | None = None  # the workers require it; the router sends it on its own requests
    overrides: OverridesSpec = field(default_factory=OverridesSpec)  # the escape hatch (spec_overrides.py)
    adapters: tuple[AdapterSpec, ...] | None = None  # None: no LoRA (the field absent); () turns LoRA on

    @property
    def lora(self) -> bool:
        """The workers serve LoRA adapters (--enable-lora): spec.adapters given, even empty."""
        return self.adapters is not None


def validate_name(name: str) -> list[str]:
    """The InferenceDeployment's name also names the Service, so it must be a DNS-1035 label."""
    if len(name) > MAX_NAME_LENGTH or not DNS1035.match(name):
        return [f"metadata.name: {name!r} must be a DNS-1035 label (lower-case letters, digits and '-', "
                f"starting with a letter, at most {MAX_NAME_LENGTH} characters) because it names the Service"]
    return []


def parse_spec(raw: Any, name: str | None = None) -> InferenceSpec:
    """Validate a raw `.spec` mapping, apply defaults and return it typed; SpecError lists every problem."""
    r = Reader(SCHEMA)
    if name is not None:
        r.problems.extend(validate_name(name))
    spec = r.obj(raw, "spec", r.keys("spec"), required=SCHEMA.at("spec").required)

    model = _parse_model(r, spec.get("model"))
    image = r.field(spec, "image", "spec")
    executor = r.field(spec, "executor", "spec")
    replicas = r.field(spec, "replicas", "spec")

    res = r.obj(spec.get("resources"), "spec.resources", r.keys("spec.resources"))
    resources = ResourcesSpec(
        gpus=r.field(res, "gpus", "spec.resources"),
        gpu_resource=r.string(res, "gpuResource", "spec.resources", DEFAULT_GPU_RESOURCE, pattern=EXTENDED_RESOURCE,
                              what="a device plugin's extended resource name such as nvidia.com/gpu, amd.com/gpu "
                                   "or nvidia.com/mig-1g.10gb (DOMAIN/NAME, not in kubernetes.io)"),
        cpu=r.quantity(res, "cpu", "spec.resources"),
        memory=r.quantity(res, "memory", "spec.resources"),
        nodes=r.field(res, "nodes", "spec.resources") or 1,
    )
    if resources.gpus > 1 and executor == "mock":
        r.bad("spec.resources.gpus", f"{resources.gpus} GPUs split the model over them (tensor parallelism), "
                                     "but the mock executor runs no model: use executor torch or one GPU")

    eng = r.obj(spec.get("engine"), "spec.engine", r.keys("spec.engine"))
    p = "spec.engine"
    engine = EngineSpec(
        block_size=r.field(eng, "blockSize", p),
        max_num_seqs=r.field(eng, "maxNumSeqs", p),
        max_model_len=r.field(eng, "maxModelLen", p),
        max_num_batched_tokens=r.field(eng, "maxNumBatchedTokens", p),
        dtype=r.field(eng, "dtype", p),
        quantization=r.field(eng, "quantization", p),
        memory_threshold=r.field(eng, "memoryThreshold", p),
        gpu_memory_utilization=r.field(eng, "gpuMemoryUtilization", p),
        kv_offloading_size=r.field(eng, "kvOffloadingSize", p),
        max_loras=r.field(eng, "maxLoras", p),
        max_lora_rank=r.field(eng, "maxLoraRank", p),
        max_cpu_loras=r.field(eng, "maxCpuLoras", p),
    )
    _check_host_tier(r, engine, resources)

    extra_args = parse_extra_args(r, eng.get("extraArgs"), f"{p}.extraArgs", tuple(asdict(engine)))
    autoscaling = _parse_autoscaling(r, spec.get("autoscaling"))

    service = _parse_service(r, spec.get("service"))

    rollout = _parse_rollout(r, spec.get("rollout"), gpu=resources.gpus > 0)
    node_selector = string_map(r, spec.get("nodeSelector"), "spec.nodeSelector")
    tolerations = _parse_tolerations(r, spec.get("tolerations"), "spec.tolerations")
    affinity = _parse_affinity(r, spec.get("affinity"), "spec.affinity")
    env = _parse_env(r, spec.get("env"))
    router = _parse_router(r, spec.get("router"))
    pod = parse_pod(r, spec)
    overrides = parse_overrides(r, spec, extra_args)
    api_key = parse_secret_key_ref(r, spec.get("apiKey"), "spec.apiKey")
    _check_scale_to_zero(r, autoscaling, router)
    _check_cache_sharing(r, model.cache, replicas, autoscaling)
    adapters = _parse_adapters(r, spec.get("adapters"), model, engine)
    if adapters is not None and resources.gpus > 1:  # the worker's EngineConfig refuses the pair too
        r.bad("spec.adapters", f"LoRA adapters do not run under tensor parallelism yet (spec.resources.gpus "
                               f"{resources.gpus} splits the model): one GPU per worker with adapters")
    if router.enabled and name is not None and len(name) > MAX_NAME_LENGTH_WITH_ROUTER:
        r.bad("metadata.name", f"must be at most {MAX_NAME_LENGTH_WITH_ROUTER} characters with the router enabled "
                               f"(the worker Service is named <name>{WORKERS_SERVICE_SUFFIX})")

    if r.problems:
        raise SpecError(r.problems)
    return InferenceSpec(
        model=model, image=image, executor=executor, replicas=replicas, resources=resources,
        engine=engine, autoscaling=autoscaling, service=service, rollout=rollout, node_selector=node_selector,
        tolerations=tolerations, affinity=affinity, env=env, router=router, pod=pod,
        api_key=api_key, overrides=overrides, adapters=adapters,
    )


def _parse_model(r: Reader, raw: Any) -> ModelSpec:
    p = "spec.model"
    m = r.obj(raw, p, r.keys(p),
              required=("name",) if raw is not None else ())
    name = r.string(m, "name", p) or ""
    path = r.string(m, "path", p, pattern=re.compile(r"^/"), what="an absolute path")
    pvc = host_path = url = None
    if m.get("pvc") is not None:
        pv = r.obj(m["pvc"], f"{p}.pvc", r.keys(f"{p}.pvc"), required=("claimName",))
        claim = r.string(pv, "claimName", f"{p}.pvc")
        if claim:
            pvc = PvcSource(claim, _sub_path(r, pv, f"{p}.pvc"), r.boolean(pv, "readOnly", f"{p}.pvc", True))
    if m.get("hostPath") is not None:
        hp = r.obj(m["hostPath"], f"{p}.hostPath", r.keys(f"{p}.hostPath"), required=("path",))
        hpath = r.string(hp, "path", f"{p}.hostPath", pattern=re.compile(r"^/"), what="an absolute path")
        if hpath:
            host_path = HostPathSource(hpath, _sub_path(r, hp, f"{p}.hostPath"))
    raw_url = r.string(m, "url", p, pattern=MODEL_URL, what=MODEL_URL_FORMS)
    if raw_url and raw_url.startswith("pvc://"):
        claim, _, sub = raw_url[len("pvc://"):].partition("/")
        sub = sub.strip("/") or None
        if sub is not None and ".." in sub.split("/"):
            r.bad(f"{p}.url", f"the path in a pvc:// url must not contain '..', got {raw_url!r}")
        else:
            pvc = PvcSource(claim, sub, True)
    elif raw_url:
        url = raw_url
    given = [k for k in ("path", "pvc", "hostPath", "url") if m.get(k) is not None]
    if len(given) > 1:
        r.bad(p, f"give at most one of path, pvc, hostPath and url (got {', '.join(given)})")
    secret = r.string(m, "credentialsSecret", p, pattern=DNS1123_SUBDOMAIN, what="a Secret's name")
    size = r.quantity(m, "downloadSize", p) or DEFAULT_DOWNLOAD_SIZE
    gguf = next((f for f in (path, pvc.sub_path if pvc else None) if f and f.lower().endswith(".gguf")), None)
    cache = _parse_cache(r, m.get("cache"), raw_url, gguf)
    return ModelSpec(name=name, path=path, pvc=pvc, host_path=host_path, url=url, credentials_secret=secret,
                     download_size=size, cache=cache)


def _parse_adapters(r: Reader, raw: Any, model: ModelSpec, engine: EngineSpec) -> tuple[AdapterSpec, ...] | None:
    """spec.adapters: unique names other than the model's; hf:// and s3:// ones need the cache (one download each,
    read there by every worker); a pvc:// one must be on a claim the workers mount already (adding an adapter never
    changes the pod template). The engine's LoRA options only with adapters."""
    p = "spec.adapters"
    if raw is None:
        for key, value in (("maxLoras", engine.max_loras), ("maxLoraRank", engine.max_lora_rank),
                           ("maxCpuLoras", engine.max_cpu_loras)):
            if value is not None:
                r.bad(f"spec.engine.{key}", "applies to LoRA adapters: give spec.adapters (an empty list is fine)")
        return None
    if not isinstance(raw, list):
        r.bad(p, f"must be an array, got {type_name(raw)}")
        return None
    node = SCHEMA.at(p)
    if len(raw) > node.max_items:
        r.bad(p, f"holds at most {node.max_items} adapters, got {len(raw)}")
    mounted = {model.pvc.claim_name: "spec.model.pvc"} if model.pvc is not None else {}
    if model.cache is not None and model.cache.claim_name:
        mounted[model.cache.claim_name] = "spec.model.cache.claimName"
    out: list[AdapterSpec] = []
    for i, item in enumerate(raw):
        at = f"{p}[{i}]"
        a = r.obj(item, at, r.keys(p + "[0]"), required=("name", "url"))
        name = r.field(a, "name", at, what=f"an adapter name ({ADAPTER_NAME_RULE})")
        url = r.string(a, "url", at, pattern=MODEL_URL, what=MODEL_URL_FORMS)
        if not name or not url:
            continue
        if name == model.name:
            r.bad(f"{at}.name", f"{name!r} is the model's own name: an adapter needs a name of its own")
        if any(o.name == name for o in out):
            r.bad(f"{at}.name", f"{name!r} is given twice")
        adapter = AdapterSpec(name, url)
        if adapter.downloaded and model.cache is None:
            r.bad(f"{at}.url", "an hf:// or s3:// adapter is downloaded once into spec.model.cache, which this "
                               "InferenceDeployment does not have (or give a pvc:// adapter)")
        elif url.startswith("pvc://"):
            claim, sub = adapter.claim_path
            if ".." in sub.split("/") or not sub:
                r.bad(f"{at}.url", f"needs a path inside the claim, without '..', got {url!r}")
            elif claim not in mounted:
                known = ", ".join(f"{c!r} ({where})" for c, where in mounted.items()) or "none"
                r.bad(f"{at}.url", f"the workers mount no claim {claim!r}: a pvc:// adapter must be on the claim of "
                                   f"spec.model.pvc or spec.model.cache.claimName (mounted: {known})")
        out.append(adapter)
    return tuple(out)


def _parse_cache(r: Reader, raw: Any, url: str | None, gguf: str | None) -> CacheSpec | None:
    """spec.model.cache: claimName, or size (and storageClassName) for a claim the operator creates; for an hf:// or
    s3:// url, or a .gguf file (`gguf`, in the image or on a claim) that the download Job converts once."""
    if raw is None:
        return None
    p = "spec.model.cache"
    before = len(r.problems)
    ca = r.obj(raw, p, r.keys(p))
    claim = r.string(ca, "claimName", p, pattern=DNS1123_SUBDOMAIN, what="a PersistentVolumeClaim's name")
    storage_class = r.string(ca, "storageClassName", p, pattern=DNS1123_SUBDOMAIN, what="a StorageClass's name")
    size = r.quantity(ca, "size", p)
    if (ca.get("claimName") is None) == (ca.get("size") is None):
        r.bad(p, "give claimName (an existing ReadWriteMany claim) or size (and storageClassName) for a claim "
                 "the operator creates, not both")
    elif ca.get("claimName") is not None and ca.get("storageClassName") is not None:
        r.bad(f"{p}.storageClassName", "applies to a claim the operator creates (with size), not to claimName")
    if not (url or "").startswith(CACHE_URL_SCHEMES) and gguf is None:
        r.bad(p, "needs spec.model.url hf://ORG/NAME[@REVISION] or s3://BUCKET/PREFIX (what the download Job "
                 "fetches), or a .gguf file (path, or pvc/pvc:// with a subPath) that it converts once, got "
                 f"{'url ' + repr(url) if url else 'neither'}")
    modes = strings(r, ca, "accessModes", p, DEFAULT_CACHE_ACCESS_MODES, 1, len(ACCESS_MODES), 32)
    for i, mode in enumerate(modes):
        if mode not in ACCESS_MODES:
            r.bad(f"{p}.accessModes[{i}]", f"must be one of {', '.join(ACCESS_MODES)}, got {mode!r}")
    if not set(modes) & set(WRITABLE_ACCESS_MODES):
        r.bad(f"{p}.accessModes", f"needs a writable mode ({', '.join(WRITABLE_ACCESS_MODES)}): the download Job "
                                  "writes the claim")
    volume = r.string(ca, "volumeName", p, pattern=DNS1123_SUBDOMAIN, what="a PersistentVolume's name")
    for key in ("accessModes", "volumeName"):
        if ca.get(key) is not None and ca.get("claimName") is not None:
            r.bad(f"{p}.{key}", "applies to a claim the operator creates (with size), not to claimName")
    download = _parse_download(r, ca.get("download"), f"{p}.download")
    if len(r.problems) > before:
        return None
    return CacheSpec(claim_name=claim, size=size, storage_class_name=storage_class, access_modes=modes,
                     volume_name=volume, download=download)


def _check_cache_sharing(r: Reader, cache: CacheSpec | None, replicas: int, autoscaling: AutoscalingSpec) -> None:
    """Several workers read the cache from several nodes: the claim the operator creates must allow that."""
    most = max(replicas, autoscaling.max_replicas or 0) if autoscaling.enabled else replicas
    if cache is None or cache.claim_name or most <= 1 or set(cache.access_modes) & set(SHARED_ACCESS_MODES):
        return
    r.bad("spec.model.cache.accessModes", f"{', '.join(cache.access_modes)} lets one node mount the cache, but up to "
                                          f"{most} workers read it: add ReadWriteMany or ReadOnlyMany, or serve one "
                                          "replica")


def _parse_download(r: Reader, raw: Any, p: str) -> DownloadSpec:
    d = r.obj(raw, p, r.keys(p))
    res = r.obj(d.get("resources"), f"{p}.resources", r.keys(f"{p}.resources"))
    volumes, mounts = parse_volumes(r, d, p, DOWNLOAD_OWN_VOLUMES, DOWNLOAD_OWN_MOUNT_PATHS)
    return DownloadSpec(
        image=r.string(d, "image", p),
        node_selector=string_map(r, d.get("nodeSelector"), f"{p}.nodeSelector"),
        tolerations=tuple(_parse_tolerations(r, d.get("tolerations"), f"{p}.tolerations")),
        affinity=_parse_affinity(r, d.get("affinity"), f"{p}.affinity"),
        service_account_name=parse_name(r, d, "serviceAccountName", p),
        priority_class_name=parse_name(r, d, "priorityClassName", p),
        annotations=string_map(r, d.get("podAnnotations"), f"{p}.podAnnotations"),
        labels=parse_labels(r, d.get("podLabels"), f"{p}.podLabels"),
        volumes=volumes,
        volume_mounts=mounts,
        active_deadline_seconds=r.field(d, "activeDeadlineSeconds", p),
        backoff_limit=r.field(d, "backoffLimit", p),
        cpu=r.quantity(res, "cpu", f"{p}.resources"),
        memory=r.quantity(res, "memory", f"{p}.resources"),
    )


def _sub_path(r: Reader, data: Mapping, path: str) -> str | None:
    sub = r.string(data, "subPath", path)
    if sub is not None and (sub.startswith("/") or ".." in sub.split("/")):
        r.bad(f"{path}.subPath", f"must be a relative path without '..', got {sub!r}")
        return None
    return sub


def _parse_autoscaling(r: Reader, raw: Any) -> AutoscalingSpec:
    p = "spec.autoscaling"
    a = r.obj(raw, p, r.keys(p))
    out = AutoscalingSpec(
        enabled=r.field(a, "enabled", p),
        mode=r.field(a, "mode", p),
        min_replicas=r.field(a, "minReplicas", p),
        max_replicas=r.field(a, "maxReplicas", p),
        target_kv_cache_usage=r.field(a, "targetKVCacheUsage", p),
        target_queue_depth=r.field(a, "targetQueueDepth", p),
        scale_up_stabilization_seconds=r.field(a, "scaleUpStabilizationSeconds", p),
        scale_down_stabilization_seconds=r.field(a, "scaleDownStabilizationSeconds", p),
        interval_seconds=r.field(a, "intervalSeconds", p),
        scale_to_zero_after_seconds=r.field(a, "scaleToZeroAfterSeconds", p),
    )
    if out.enabled and out.max_replicas is None:
        r.bad(f"{p}.maxReplicas", "is required when autoscaling is enabled")
    if out.max_replicas is not None and out.min_replicas > out.max_replicas:
        r.bad(p, f"minReplicas ({out.min_replicas}) must not be greater than maxReplicas ({out.max_replicas})")
    return out


def _parse_service(r: Reader, raw: Any) -> ServiceSpec:
    p = "spec.service"
    svc = r.obj(raw, p, r.keys(p))
    out = ServiceSpec(
        type=r.field(svc, "type", p),
        port=r.field(svc, "port", p),
        annotations=string_map(r, svc.get("annotations"), f"{p}.annotations"),
        load_balancer_class=r.string(svc, "loadBalancerClass", p, pattern=LOAD_BALANCER_CLASS,
                                     what="a label-style name with a domain prefix, e.g. service.k8s.aws/nlb"),
        load_balancer_source_ranges=strings(r, svc, "loadBalancerSourceRanges", p, (), 0, 64, 64),
        ingress=_parse_ingress(r, svc.get("ingress"), f"{p}.ingress"),
        http_route=_parse_http_route(r, svc.get("httpRoute"), f"{p}.httpRoute"),
    )
    if out.type != "LoadBalancer":
        for key in ("loadBalancerClass", "loadBalancerSourceRanges"):
            if svc.get(key) is not None:
                r.bad(f"{p}.{key}", f"applies to type LoadBalancer only, got type {out.type}")
    return out


def _parse_ingress(r: Reader, raw: Any, p: str) -> IngressSpec | None:
    if raw is None:
        return None
    ing = r.obj(raw, p, r.keys(p))
    return IngressSpec(class_name=r.field(ing, "className", p), host=r.field(ing, "host", p),
                       path=r.field(ing, "path", p), annotations=string_map(r, ing.get("annotations"),
                                                                          f"{p}.annotations"),
                       tls_secret_name=r.field(ing, "tlsSecretName", p))


def _parse_http_route(r: Reader, raw: Any, p: str) -> HTTPRouteSpec | None:
    if raw is None:
        return None
    route = r.obj(raw, p, r.keys(p), required=("parentRefs",))
    refs = route.get("parentRefs")
    parents: list[ParentRef] = []
    if not isinstance(refs, list) or not refs:
        r.bad(f"{p}.parentRefs", "must name at least one Gateway")
    else:
        for i, ref in enumerate(refs[:32]):
            q = f"{p}.parentRefs[{i}]"
            item = r.obj(ref, q, r.keys(q), required=("name",))
            name = r.field(item, "name", q)
            if name is not None:
                parents.append(ParentRef(name, r.field(item, "namespace", q), r.field(item, "sectionName", q)))
    hostnames = strings(r, route, "hostnames", p, (), 0, 16, 253)
    return HTTPRouteSpec(tuple(parents), hostnames, r.field(route, "path", p))


def _parse_router_pod(r: Reader, ro: Mapping[str, Any], p: str) -> RouterPodSpec:
    return RouterPodSpec(
        node_selector=string_map(r, ro.get("nodeSelector"), f"{p}.nodeSelector"),
        tolerations=tuple(_parse_tolerations(r, ro.get("tolerations"), f"{p}.tolerations")),
        affinity=_parse_affinity(r, ro.get("affinity"), f"{p}.affinity"),
        topology_spread_constraints=parse_spread(r, ro.get("topologySpreadConstraints"),
                                                 f"{p}.topologySpreadConstraints"),
        priority_class_name=parse_name(r, ro, "priorityClassName", p),
        annotations=string_map(r, ro.get("podAnnotations"), f"{p}.podAnnotations"),
        labels=parse_labels(r, ro.get("podLabels"), f"{p}.podLabels"),
    )


def _parse_router(r: Reader, raw: Any) -> RouterSpec:
    p = "spec.router"
    ro = r.obj(raw, p, r.keys(p))
    res = r.obj(ro.get("resources"), f"{p}.resources", r.keys(f"{p}.resources"))
    pool = None
    if ro.get("inferencePool") is not None:
        ip = r.obj(ro["inferencePool"], f"{p}.inferencePool", r.keys(f"{p}.inferencePool"),
                   required=("endpointPicker",))
        picker = r.string(ip, "endpointPicker", f"{p}.inferencePool", pattern=DNS1035, what="a Service name")
        port = r.field(ip, "endpointPickerPort", f"{p}.inferencePool")
        if picker:
            pool = InferencePoolSpec(picker, port)
    return RouterSpec(
        enabled=r.field(ro, "enabled", p),
        replicas=r.field(ro, "replicas", p),
        policy=r.field(ro, "policy", p),
        image=r.field(ro, "image", p),
        cpu=r.quantity(res, "cpu", f"{p}.resources"),
        memory=r.quantity(res, "memory", f"{p}.resources"),
        hold_timeout_seconds=r.integer(ro, "holdTimeoutSeconds", p, DEFAULT_HOLD_TIMEOUT_SECONDS, minimum=1,
                                       maximum=3600),
        inference_pool=pool,
        cors=_parse_cors(r, ro.get("cors"), f"{p}.cors"),
        tokenizer=r.field(ro, "tokenizer", p),
        api_key=parse_secret_key_ref(r, ro.get("apiKey"), f"{p}.apiKey"),
        pod=_parse_router_pod(r, ro, p),
        flow=_parse_flow(r, ro.get("flowControl"), f"{p}.flowControl"),
    )


def _parse_flow(r: Reader, raw: Any, p: str) -> RouterFlowSpec:
    fo = r.obj(raw, p, r.keys(p))
    out = RouterFlowSpec(enabled=r.field(fo, "enabled", p), max_queued=r.field(fo, "maxQueued", p),
                         queue_timeout_seconds=r.field(fo, "queueTimeoutSeconds", p),
                         tenant_header=r.field(fo, "tenantHeader", p, "a header name") or None,
                         priority_classes=_named_ints(r, fo, "priorityClasses", p, ("name", "priority")),
                         priority_class_header=r.field(fo, "priorityClassHeader", p, "a header name") or None,
                         tenant_limits=_named_ints(r, fo, "tenantLimits", p, ("tenant", "maxInFlight")))
    if out.priority_classes and out.priority_class_header is None:
        r.bad(f"{p}.priorityClassHeader", "required with priorityClasses: the header requests name their class in")
    return out


def _named_ints(r: Reader, data: Mapping, key: str, p: str, fields: tuple[str, str]) -> tuple[tuple[str, int], ...]:
    """An array of {name: ..., number: ...} objects (priorityClasses, tenantLimits) as ((name, number), ...), the names
    distinct."""
    raw = data.get(key)
    if raw is None:
        return ()
    if not isinstance(raw, list):
        r.bad(f"{p}.{key}", f"must be an array, got {type_name(raw)}")
        return ()
    out: list[tuple[str, int]] = []
    for i, item in enumerate(raw):
        q = f"{p}.{key}[{i}]"
        obj = r.obj(item, q, r.keys(q), required=fields)
        name, number = r.field(obj, fields[0], q), r.field(obj, fields[1], q)
        if name is None or number is None:
            continue
        if any(name == n for n, _ in out):
            r.bad(f"{q}.{fields[0]}", f"{name!r} is given twice")
            continue
        out.append((name, number))
    return tuple(out)


def _parse_cors(r: Reader, raw: Any, p: str) -> RouterCorsSpec:
    co = r.obj(raw, p, r.keys(p))
    before = len(r.problems)
    lists = {key: strings(r, co, key, p, default, 0 if key == "allowedOrigins" else 1, *CORS_LIMITS[key])
             for key, default in (("allowedOrigins", ()), ("allowedMethods", DEFAULT_CORS_METHODS),
                                  ("allowedHeaders", DEFAULT_CORS_HEADERS))}
    out = RouterCorsSpec(lists["allowedOrigins"], lists["allowedMethods"], lists["allowedHeaders"],
                         r.field(co, "allowCredentials", p))
    if len(r.problems) == before and (bad := cors.check_options(
            list(out.allowed_origins), list(out.allowed_methods), list(out.allowed_headers), out.allow_credentials)):
        option, why = bad  # the router would refuse to start with these: say so here, with the spec's names
        r.bad(f"{p}.{_CORS_FIELDS[option]}", f"{why} (the router's --{option.replace('_', '-')})")
    return out

_CORS_FIELDS = {"allowed_origins": "allowedOrigins", "allowed_methods": "allowedMethods",
                "allowed_headers": "allowedHeaders", "allow_credentials": "allowCredentials"}


def _check_scale_to_zero(r: Reader, a: AutoscalingSpec, router: RouterSpec) -> None:
    """minReplicas 0 needs something that holds requests while the first worker starts: the router, whose
    held-requests gauge the operator's autoscaler reads (an HPA cannot scale from zero on worker metrics)."""
    if a.min_replicas != 0:
        return
    if not router.enabled:
        r.bad("spec.autoscaling.minReplicas", "0 (scale to zero) needs spec.router.enabled: true, so that "
                                              "requests are held while the first worker starts")
    if a.mode != "operator":
        r.bad("spec.autoscaling.minReplicas", "0 (scale to zero) needs mode operator (the HPA cannot scale "
                                              "from zero on the workers' metrics)")


def _int_or_percent(r: Reader, data: Mapping, key: str, path: str) -> int | str | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and INT_OR_PERCENT.match(value):
        return value
    r.bad(f"{path}.{key}", f"must be a non-negative integer or a percentage such as 25%, got {value!r}")
    return None


def _is_zero(value: int | str | None) -> bool:
    return value in (0, "0%")


def _parse_rollout(r: Reader, raw: Any, gpu: bool) -> RolloutSpec:
    p = "spec.rollout"
    ro = r.obj(raw, p, r.keys(p))
    strategy = r.field(ro, "strategy", p)
    surge = _int_or_percent(r, ro, "maxSurge", p)
    unavailable = _int_or_percent(r, ro, "maxUnavailable", p)
    if strategy == "Recreate":
        if ro.get("maxSurge") is not None or ro.get("maxUnavailable") is not None:
            r.bad(p, "maxSurge and maxUnavailable apply to strategy RollingUpdate only")
        return RolloutSpec("Recreate", None, None)
    default_surge, default_unavailable = DEFAULT_ROLLOUT[gpu]
    if surge is None and unavailable is None:
        surge, unavailable = default_surge, default_unavailable
    elif surge is None:  # one given: the other as permissive as the pool allows, never both zero
        surge = 0 if gpu or not _is_zero(unavailable) else 1
    elif unavailable is None:
        unavailable = 1 if _is_zero(surge) else 0
    if _is_zero(surge) and _is_zero(unavailable):
        r.bad(p, "maxSurge and maxUnavailable must not both be 0 (the rollout could never progress)")
    return RolloutSpec(strategy, surge, unavailable)


def _parse_affinity(r: Reader, raw: Any, path: str) -> dict[str, Any] | None:
    if raw is not None and not isinstance(raw, Mapping):
        r.bad(path, f"must be an object, got {type_name(raw)}")
        return None
    return dict(raw) if raw else None


def _parse_tolerations(r: Reader, raw: Any, path: str) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        r.bad(path, f"must be an array, got {type_name(raw)}")
        return []
    out = []
    for i, item in enumerate(raw):
        p = f"{path}[{i}]"
        t = r.obj(item, p, r.keys(p))
        r.field(t, "key", p)
        r.field(t, "operator", p)
        if t.get("value") is not None and not isinstance(t.get("value"), str):
            r.bad(f"{p}.value", f"must be a string, got {type_name(t.get('value'))}")
        r.field(t, "effect", p)
        r.field(t, "tolerationSeconds", p)
        out.append(dict(t))
    return out


def _parse_env(r: Reader, raw: Any) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        r.bad("spec.env", f"must be an array, got {type_name(raw)}")
        return []
    out = []
    for i, item in enumerate(raw):
        p = f"spec.env[{i}]"
        e = r.obj(item, p, r.keys(p), required=("name",))
        r.string(e, "name", p, pattern=ENV_NAME, what="a valid environment variable name")
        if e.get("value") is not None and not isinstance(e.get("value"), str):
            r.bad(f"{p}.value", f"must be a string, got {type_name(e.get('value'))}")
        if e.get("valueFrom") is not None and not isinstance(e.get("valueFrom"), Mapping):
            r.bad(f"{p}.valueFrom", f"must be an object, got {type_name(e.get('valueFrom'))}")
        if e.get("value") is not None and e.get("valueFrom") is not None:
            r.bad(p, "give value or valueFrom, not both")
        out.append(dict(e))
    return out


def _check_host_tier(r: Reader, engine: EngineSpec, resources: ResourcesSpec) -> None:
    """The host KV tier lives in the pod's memory: with spec.resources.memory given, it must leave the process room
    (without it, the operator adds the tier to the default; manifests/worker.py)."""
    tier = engine.kv_offloading_size
    if not tier or resources.memory is None:
        return
    memory = parse_quantity(resources.memory)
    if memory is not None and Decimal(str(tier)) * 2**30 >= memory:
        r.bad("spec.engine.kvOffloadingSize", f"the host KV tier ({tier:g} GiB) does not fit in "
              f"spec.resources.memory ({resources.memory}), which must hold the tier and the worker process: "
              "raise spec.resources.memory, or leave it out and the operator adds the tier to the default")

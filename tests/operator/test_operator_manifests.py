"""spec -> manifests: the worker Deployment, Service, PDB and HPA (pure functions, no server)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import kubernetes_validate
import pytest

from hetero_infer.operator import constants as c
from hetero_infer.operator.diff import parse_quantity, strip_none
from hetero_infer.operator.manifests import (
    CACHE_DIR,
    SHUTDOWN_GRACE_SECONDS,
    TERMINATION_GRACE_SECONDS,
    Owner,
    WorkerDefaults,
    children,
    command_line,
    endpoint,
    model_path,
    quantity,
    selector_string,
    worker_args,
)
from hetero_infer.operator.spec import SpecError, parse_spec

OWNER = Owner("smol", "models", "0000-1111")
K8S_VERSIONS = ["1.30.0", kubernetes_validate.latest_version()]


def spec(**raw: Any) -> Any:
    body: dict[str, Any] = {"model": {"name": "smollm2"}}
    body.update(raw)
    return parse_spec(body)


def pod(kids: Any) -> dict[str, Any]:
    return kids.deployment["spec"]["template"]["spec"]


def worker(kids: Any) -> dict[str, Any]:
    return pod(kids)["containers"][0]


def test_minimal_spec_gives_a_cpu_worker_with_probes_security_and_drain() -> None:
    kids = children(OWNER, spec())
    dep = kids.deployment
    assert dep["metadata"]["name"] == "smol" and dep["metadata"]["namespace"] == "models"
    assert dep["metadata"]["ownerReferences"][0]["uid"] == "0000-1111"
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["selector"]["matchLabels"] == {c.LABEL_OWNER: "smol", c.LABEL_COMPONENT: "worker"}
    assert dep["spec"]["template"]["metadata"]["labels"][c.LABEL_MANAGED_BY] == c.MANAGED_BY
    ctr = worker(kids)
    assert ctr["image"] == c.DEFAULT_WORKER_IMAGE
    assert ctr["command"] == ["hetero-infer"]
    assert ctr["args"] == ["serve", "--host", "0.0.0.0", "--port", "3000", "--served-model-name", "smollm2",
                           "--executor", "torch", "--device", "cpu", "--shutdown-grace", "45"]
    assert ctr["ports"] == [{"name": "http", "containerPort": 3000, "protocol": "TCP"}]
    assert ctr["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert ctr["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert ctr["startupProbe"]["periodSeconds"] * ctr["startupProbe"]["failureThreshold"] >= 600
    assert "nvidia.com/gpu" not in ctr["resources"]["requests"]
    sec = ctr["securityContext"]
    assert sec["allowPrivilegeEscalation"] is False and sec["readOnlyRootFilesystem"] is True
    assert sec["capabilities"] == {"drop": ["ALL"]} and sec["runAsNonRoot"] is True
    p = pod(kids)
    assert p["securityContext"]["runAsNonRoot"] is True and p["securityContext"]["runAsUser"] > 0
    assert p["automountServiceAccountToken"] is False
    assert p["terminationGracePeriodSeconds"] == TERMINATION_GRACE_SECONDS
    assert "exec" not in ctr["lifecycle"]["preStop"]  # Kubernetes' sleep action: no sleep binary in the image
    # preStop, then SIGTERM and the worker's drain: all inside the pod's grace period.
    prestop = ctr["lifecycle"]["preStop"]["sleep"]["seconds"]
    drain = float(ctr["args"][ctr["args"].index("--shutdown-grace") + 1])
    assert prestop + drain < p["terminationGracePeriodSeconds"]
    shm = next(v for v in p["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    mounts = {m["mountPath"] for m in ctr["volumeMounts"]}
    assert {"/dev/shm", "/tmp", CACHE_DIR} <= mounts  # writable places under a read-only root
    annotations = dep["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/port"] == "3000"
    assert annotations["prometheus.io/path"] == "/metrics"
    assert kids.hpa is None


def test_gpu_spec_requests_the_gpu_and_runs_on_cuda() -> None:
    kids = children(OWNER, spec(resources={"gpus": 1, "memory": "32Gi"}),
                    WorkerDefaults(image="cpu:1", gpu_image="gpu:1"))
    ctr = worker(kids)
    assert ctr["image"] == "gpu:1"
    assert ctr["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert ctr["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert ctr["resources"]["limits"]["memory"] == "32Gi"
    assert ctr["args"][ctr["args"].index("--device") + 1] == "cuda"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod(kids)["tolerations"]


def test_the_host_kv_tier_is_counted_in_the_pods_memory() -> None:
    """spec.engine.kvOffloadingSize (GiB, as vLLM's flag) becomes --kv-offloading-size; without
    spec.resources.memory the pod's memory request and limit are the default plus the tier; a given memory must hold
    the tier and the process, or the spec is refused with what to change."""
    from hetero_infer.operator.manifests.worker import DEFAULT_MEMORY

    s = spec(engine={"kvOffloadingSize": 2.5})
    pairs = dict(zip(worker_args(s)[1::2], worker_args(s)[2::2], strict=False))
    assert pairs["--kv-offloading-size"] == "2.5"
    resources = pod(children(OWNER, s))["containers"][0]["resources"]
    expected = (parse_quantity(DEFAULT_MEMORY[False]) + Decimal("2.5") * 2**30)
    assert parse_quantity(resources["requests"]["memory"]) == expected
    assert parse_quantity(resources["limits"]["memory"]) == expected
    given = spec(engine={"kvOffloadingSize": 2}, resources={"memory": "8Gi"})
    assert pod(children(OWNER, given))["containers"][0]["resources"]["limits"]["memory"] == "8Gi"
    with pytest.raises(SpecError, match="kvOffloadingSize.*does not fit in spec.resources.memory"):
        spec(engine={"kvOffloadingSize": 2}, resources={"memory": "2Gi"})
    with pytest.raises(SpecError, match="kvOffloadingSize"):
        spec(engine={"kvOffloadingSize": -1})


def test_engine_options_become_the_worker_cli_flags() -> None:
    s = spec(executor="mock", engine={"blockSize": 32, "maxNumSeqs": 64, "maxModelLen": 4096,
                                      "maxNumBatchedTokens": 1024, "dtype": "bfloat16", "quantization": "int4",
                                      "memoryThreshold": 0.85, "gpuMemoryUtilization": 0.5})
    args = worker_args(s)
    pairs = dict(zip(args[1::2], args[2::2], strict=False))
    assert pairs["--executor"] == "mock"
    assert pairs["--block-size"] == "32" and pairs["--max-num-seqs"] == "64"
    assert pairs["--max-model-len"] == "4096" and pairs["--max-num-batched-tokens"] == "1024"
    assert pairs["--dtype"] == "bfloat16" and pairs["--quantization"] == "int4"
    assert pairs["--memory-threshold"] == "0.85" and pairs["--gpu-memory-utilization"] == "0.5"
    assert command_line(s).startswith("hetero-infer serve --host 0.0.0.0 --port 3000")


@pytest.mark.parametrize(("model", "path", "volume"), [
    ({"name": "m"}, None, None),
    ({"name": "m", "path": "/opt/models/qwen"}, "/opt/models/qwen", None),
    ({"name": "m", "pvc": {"claimName": "weights", "subPath": "qwen3"}}, "/models/qwen3", "persistentVolumeClaim"),
    ({"name": "m", "hostPath": {"path": "/data/llm"}}, "/models", "hostPath"),
    ({"name": "m", "url": "pvc://weights/qwen3"}, "/models/qwen3", "persistentVolumeClaim"),
])
def test_model_sources(model: dict[str, Any], path: str | None, volume: str | None) -> None:
    kids = children(OWNER, spec(model=model))
    args = worker(kids)["args"]
    if path is None:
        assert "--model" not in args  # the image's default model
    else:
        assert args[args.index("--model") + 1] == path
    model_volumes = [v for v in pod(kids)["volumes"] if v["name"] == "model"]
    assert [next(k for k in v if k != "name") for v in model_volumes] == ([volume] if volume else [])
    for m in worker(kids)["volumeMounts"]:
        if m["name"] == "model":
            assert m["readOnly"] is True


@pytest.mark.parametrize("url", ["hf://Qwen/Qwen3-8B@main", "s3://models/llama/8b"])
def test_a_model_url_is_fetched_by_an_init_container_into_a_sized_volume(url: str) -> None:
    kids = children(OWNER, spec(model={"name": "m", "url": url, "credentialsSecret": "model-creds",
                                       "downloadSize": "40Gi"}))
    args, env = worker(kids)["args"], {e["name"]: e.get("value") for e in worker(kids)["env"]}
    assert args[args.index("--model") + 1] == url
    [fetch] = pod(kids)["initContainers"]
    assert fetch["command"] == ["hetero-infer", "fetch", url] and fetch["image"] == worker(kids)["image"]
    assert fetch["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert [v for v in pod(kids)["volumes"] if v["name"] == "model"] == [
        {"name": "model", "emptyDir": {"sizeLimit": "40Gi"}}]
    assert fetch["resources"]["requests"]["ephemeral-storage"] == "40Gi"
    assert worker(kids)["resources"]["requests"]["ephemeral-storage"] == "40Gi"
    # the credentials come from the Secret, never inline; both containers read the same cache
    assert fetch["envFrom"] == worker(kids)["envFrom"] == [{"secretRef": {"name": "model-creds"}}]
    fetch_env = {e["name"]: e.get("value") for e in fetch["env"]}
    for name in ("HF_HOME", "HETERO_INFER_MODEL_CACHE"):
        assert fetch_env[name] == env[name] and env[name].startswith("/models/")
    assert env["HF_HUB_OFFLINE"] == "1" and "HF_HUB_OFFLINE" not in fetch_env
    assert {m["mountPath"] for m in fetch["volumeMounts"]} >= {"/models", "/tmp"}
    assert not any("startupProbe" in k or "livenessProbe" in k for k in fetch)  # a download is never a slow start


def test_the_init_container_gets_spec_env_where_the_model_comes_from() -> None:
    """A Hub mirror or an S3 endpoint set in spec.env is where the init container downloads from."""
    kids = children(OWNER, spec(model={"name": "m", "url": "hf://org/m"},
                                env=[{"name": "HF_ENDPOINT", "value": "http://hub.local:8080"},
                                     {"name": "HOME", "value": "/home/x"}]))
    [fetch] = pod(kids)["initContainers"]
    fetch_env = [(e["name"], e.get("value")) for e in fetch["env"]]
    assert ("HF_ENDPOINT", "http://hub.local:8080") in fetch_env
    assert [v for n, v in fetch_env if n == "HOME"] == ["/home/x"]  # the user's value, once


def test_no_init_container_without_a_model_url() -> None:
    for model in ({"name": "m"}, {"name": "m", "url": "pvc://w/x"}):
        kids = children(OWNER, spec(model=model))
        assert pod(kids)["initContainers"] is None and worker(kids)["envFrom"] is None
        assert "ephemeral-storage" not in worker(kids)["resources"]["requests"]


def test_user_env_placement_and_overrides() -> None:
    kids = children(OWNER, spec(env=[{"name": "HETERO_INFER_MAX_NUM_SEQS", "value": "8"},
                                     {"name": "HOME", "value": "/work"}],
                                nodeSelector={"pool": "llm"},
                                affinity={"nodeAffinity": {}},
                                tolerations=[{"key": "dedicated", "operator": "Equal", "value": "llm"}]))
    env = worker(kids)["env"]
    assert [e for e in env if e["name"] == "HOME"] == [{"name": "HOME", "value": "/work"}]
    assert {"name": "HETERO_INFER_MAX_NUM_SEQS", "value": "8"} in env
    p = pod(kids)
    assert p["nodeSelector"] == {"pool": "llm"} and p["affinity"] == {"nodeAffinity": {}}
    assert p["tolerations"] == [{"key": "dedicated", "operator": "Equal", "value": "llm"}]


def test_service_pdb_and_endpoint() -> None:
    s = spec(service={"type": "LoadBalancer", "port": 8000})
    kids = children(OWNER, s)
    svc = kids.service["spec"]
    assert svc["type"] == "LoadBalancer"
    assert svc["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]
    assert svc["selector"] == kids.deployment["spec"]["selector"]["matchLabels"]
    assert kids.pdb["spec"]["maxUnavailable"] == 1
    assert kids.pdb["spec"]["selector"]["matchLabels"] == svc["selector"]
    assert endpoint(OWNER, s) == "http://smol.models.svc:8000/v1"
    assert endpoint(OWNER, spec()) == "http://smol.models.svc/v1"
    assert selector_string("smol") == f"{c.LABEL_COMPONENT}=worker,{c.LABEL_OWNER}=smol"


def test_hpa_targets_the_inference_deployment_on_worker_metrics() -> None:
    s = spec(autoscaling={"enabled": True, "mode": "hpa", "minReplicas": 2, "maxReplicas": 6,
                          "targetKVCacheUsage": 0.75, "targetQueueDepth": 3,
                          "scaleUpStabilizationSeconds": 10, "scaleDownStabilizationSeconds": 120})
    hpa = children(OWNER, s).hpa
    assert hpa is not None and hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": c.API_VERSION, "kind": c.KIND, "name": "smol"}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 6)
    targets = {m["pods"]["metric"]["name"]: m["pods"]["target"] for m in hpa["spec"]["metrics"]}
    assert targets == {c.METRIC_KV_CACHE_USAGE: {"type": "AverageValue", "averageValue": "750m"},
                       c.METRIC_REQUESTS_WAITING: {"type": "AverageValue", "averageValue": "3"}}
    assert hpa["spec"]["behavior"]["scaleUp"]["stabilizationWindowSeconds"] == 10
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 120


@pytest.mark.parametrize("autoscaling", [
    {"enabled": False, "mode": "hpa", "maxReplicas": 3},
    {"enabled": True, "mode": "operator", "maxReplicas": 3},
])
def test_no_hpa_unless_enabled_in_hpa_mode(autoscaling: dict[str, Any]) -> None:
    assert children(OWNER, spec(autoscaling=autoscaling)).hpa is None


def test_quantity_formatting() -> None:
    assert [quantity(v) for v in (0.8, 1.0, 5, 0.125, 2.5)] == ["800m", "1", "5", "125m", "2500m"]


@pytest.mark.parametrize(("raw", "strategy"), [
    ({}, {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}),
    # A full GPU pool: no room for a surge pod, so one old pod goes first.
    ({"resources": {"gpus": 1}}, {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}),
    ({"resources": {"gpus": 1}, "rollout": {"maxSurge": 1}},
     {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}),
    ({"rollout": {"maxSurge": 0}}, {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}),
    ({"rollout": {"maxSurge": "50%", "maxUnavailable": "25%"}},
     {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "50%", "maxUnavailable": "25%"}}),
    ({"rollout": {"strategy": "Recreate"}}, {"type": "Recreate", "rollingUpdate": None}),
])
def test_rollout_strategy_with_defaults_by_pool(raw: dict[str, Any], strategy: dict[str, Any]) -> None:
    assert children(OWNER, spec(**raw)).deployment["spec"]["strategy"] == strategy


def test_a_rollout_that_could_never_progress_is_rejected() -> None:
    with pytest.raises(SpecError, match="both be 0"):
        spec(rollout={"maxSurge": 0, "maxUnavailable": "0%"})


FULL_SPECS = {
    "minimal": {},
    "gpu-pvc": {"resources": {"gpus": 1, "cpu": 8, "memory": "48Gi"}, "model": {"name": "m", "pvc": {"claimName": "w"}},
                "tolerations": [{"key": "a", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}],
                "nodeSelector": {"gpu": "h100"}},
    "recreate": {"rollout": {"strategy": "Recreate"}},
    "hub-url": {"model": {"name": "m", "url": "hf://org/name@v1", "credentialsSecret": "hf", "downloadSize": "30Gi"}},
    "hpa-hostpath": {"rollout": {"maxSurge": "25%", "maxUnavailable": 0},"model": {"name": "m", "hostPath": {"path": "/data", "subPath": "llama"}},
                     "autoscaling": {"enabled": True, "mode": "hpa", "maxReplicas": 4},
                     "env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                     "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                         {"weight": 50, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"}}]}}},
}


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("name", list(FULL_SPECS))
def test_every_child_validates_against_the_kubernetes_schemas(name: str, version: str) -> None:
    kids = children(OWNER, spec(**FULL_SPECS[name]))
    for manifest in kids.all():
        kubernetes_validate.validate(strip_none(manifest), version, strict=True)


def test_the_schema_check_is_strict_enough_to_fail() -> None:
    dep = strip_none(children(OWNER, spec()).deployment)
    dep["spec"]["template"]["spec"]["containers"][0]["livenessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(dep, K8S_VERSIONS[-1], strict=True)


@pytest.mark.parametrize("name", list(FULL_SPECS) + ["engine"])
def test_the_worker_cli_accepts_the_generated_command_line(name: str) -> None:
    """Contract with `hetero-infer serve`: its own parser reads what the operator writes."""
    from hetero_infer.worker.server.cli import build_parser, resolve_options

    raw = FULL_SPECS.get(name) or {"executor": "mock", "engine": {
        "blockSize": 32, "maxNumSeqs": 64, "maxModelLen": 4096, "maxNumBatchedTokens": 1024, "dtype": "bfloat16",
        "quantization": "int8", "memoryThreshold": 0.85, "gpuMemoryUtilization": 0.5}}
    s = spec(**raw)
    args = worker_args(s)
    assert args[0] == "serve"
    options, engine = resolve_options(build_parser().parse_args(args[1:]), environ={})
    assert (options.host, options.port) == ("0.0.0.0", 3000)
    assert engine.served_model_name == s.model.name
    assert engine.model == model_path(s)
    assert options.shutdown_grace == SHUTDOWN_GRACE_SECONDS
    assert engine.executor == s.executor
    assert engine.device == ("cuda" if s.resources.gpus else "cpu")
    e = s.engine
    for field, value in (("block_size", e.block_size), ("max_num_seqs", e.max_num_seqs),
                         ("max_model_len", e.max_model_len), ("max_num_batched_tokens", e.max_num_batched_tokens),
                         ("dtype", e.dtype), ("quantization", e.quantization),
                         ("memory_threshold", e.memory_threshold),
                         ("gpu_memory_utilization", e.gpu_memory_utilization)):
        if value is not None:
            assert getattr(engine, field) == value, field

"""What a platform team sets on day one (issue 44): the GPU's device-plugin resource, where and as whom the download
Job runs; each knob rendered where it belongs and accepted by the Kubernetes schemas (strict)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from hetero_infer.operator import constants as c
from hetero_infer.operator.diff import strip_none
from hetero_infer.operator.manifests import Owner, children
from hetero_infer.operator.manifests.cache import download_job
from hetero_infer.operator.manifests.common import WorkerDefaults
from hetero_infer.operator.spec import parse_spec

OWNER = Owner("smol", "models", "uid-1")
K8S_VERSIONS = ["1.30.0", kubernetes_validate.latest_version()]
ROOT = Path(__file__).resolve().parents[2]


def worker_pod(**raw: Any) -> dict[str, Any]:
    dep = children(OWNER, parse_spec({"model": {"name": "smol"}, **raw}, "smol")).deployment
    return dep["spec"]["template"]["spec"]


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize(("resource", "taints"), [
    ("nvidia.com/gpu", ["nvidia.com/gpu"]),
    ("amd.com/gpu", ["amd.com/gpu"]),
    ("nvidia.com/mig-1g.10gb", ["nvidia.com/mig-1g.10gb", "nvidia.com/gpu"]),  # a MIG node is tainted nvidia.com/gpu
    ("gpu.intel.com/i915", ["gpu.intel.com/i915"]),
])
def test_the_gpu_is_asked_for_as_the_device_plugins_resource(resource: str, taints: list[str], version: str) -> None:
    pod = worker_pod(resources={"gpus": 1, "gpuResource": resource})
    (worker,) = pod["containers"]
    assert worker["resources"]["requests"][resource] == "1" and worker["resources"]["limits"][resource] == "1"
    assert not {"nvidia.com/gpu"} & (set(worker["resources"]["limits"]) - {resource})
    assert [t["key"] for t in pod["tolerations"]] == taints
    assert "--device" in worker["args"] and worker["args"][worker["args"].index("--device") + 1] == "cuda"
    dep = children(OWNER, parse_spec({"model": {"name": "smol"}, "resources": {"gpus": 1, "gpuResource": resource}},
                                     "smol")).deployment
    kubernetes_validate.validate(strip_none(dep), version, strict=True)


def test_a_cpu_worker_asks_for_no_device() -> None:
    pod = worker_pod(resources={"gpuResource": "amd.com/gpu"})
    assert "amd.com/gpu" not in pod["containers"][0]["resources"]["limits"] and pod.get("tolerations") is None


def test_the_download_job_of_gpu_workers_runs_the_cpu_image() -> None:
    """A download needs no CUDA: a GPU model's Job runs the operator's CPU worker image, unless download.image says
    otherwise, or the model is a .gguf inside the worker's image (only that image has the file)."""
    defaults = WorkerDefaults(image="cpu:1", gpu_image="cuda:1")
    model = {"name": "m", "url": "hf://o/n", "cache": {"size": "5Gi"}}

    def image(**raw: Any) -> str:
        spec = parse_spec({"model": model, "resources": {"gpus": 1}, **raw}, "smol")
        return download_job(OWNER, spec, defaults, "c")["spec"]["template"]["spec"]["containers"][0]["image"]

    assert image() == "cpu:1"
    assert image(image="mine-cuda:2") == "cpu:1"
    model["cache"]["download"] = {"image": "fetch:3"}
    assert image() == "fetch:3"
    model.update(url=None, path="/models/m.Q4_K_M.gguf", cache={"size": "5Gi"})
    assert image() == "cuda:1"


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_platform_example_renders_valid_objects(version: str) -> None:
    docs = list(yaml.safe_load_all((ROOT / "examples" / "platform.yaml").read_text()))
    (obj,) = [d for d in docs if d["kind"] == c.KIND]
    spec = parse_spec(obj["spec"], obj["metadata"]["name"])
    owner = Owner(obj["metadata"]["name"], "models", "uid-1")
    job = download_job(owner, spec, WorkerDefaults(), "shared-models")
    for manifest in [job, *children(owner, spec, cached="k").all()]:
        kubernetes_validate.validate(strip_none(manifest), version, strict=True)
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] and pod["nodeSelector"] and job["spec"]["podFailurePolicy"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert any(env.get("AWS_CA_BUNDLE", "").startswith(m) for m in mounts)  # the CA bundle is really there


# -- the escape hatch -----------------------------------------------------------------------------------------------

def test_extra_engine_args_reach_the_worker_command_line_after_the_rendered_flags() -> None:
    args = ["--enable-prefix-caching", "--seed", "7", "--max-num-blocks=4096"]
    (worker,) = worker_pod(engine={"maxNumSeqs": 8, "extraArgs": args})["containers"]
    assert worker["args"][-4:] == args and worker["args"].index("--max-num-seqs") < len(worker["args"]) - 4
    # what the worker then parses: its own parser takes the whole line
    from hetero_infer.worker.server.cli import build_parser, resolve_options

    options, engine = resolve_options(build_parser().parse_args(worker["args"][1:]), environ={})
    assert engine.enable_prefix_caching and engine.seed == 7 and engine.max_num_blocks == 4096
    assert engine.max_num_seqs == 8


@pytest.mark.parametrize(("args", "needle"), [
    (["--turbo"], "unrecognized arguments: --turbo"),
    (["--seed", "seven"], "--seed"),
    (["--model", "/elsewhere"], "--model is set by the operator (spec.model)"),
    (["--port", "8000"], "--port is set by the operator"),
    (["--max-num-seqs", "4"], "--max-num-seqs is spec.engine's field"),
    (["--api-key", "k"], "--api-key is a secret"),
])
def test_extra_engine_args_the_worker_would_refuse_are_refused_here(args: list[str], needle: str) -> None:
    from hetero_infer.operator.spec import SpecError

    with pytest.raises(SpecError) as info:
        parse_spec({"model": {"name": "m"}, "engine": {"extraArgs": args}}, "m")
    assert any(p.startswith("spec.engine.extraArgs") and needle in p for p in info.value.problems), info.value


def test_json_patches_shm_probes_and_security_reach_the_worker_pod() -> None:
    pod = worker_pod(
        jsonPatches=[{"op": "add", "path": "/spec/containers/0/env/-", "value": {"name": "NCCL_DEBUG", "value": "INFO"}},
                     {"op": "add", "path": "/spec/hostIPC", "value": False},
                     {"op": "add", "path": "/metadata/annotations/team", "value": "search"}],
        shmSize="8Gi",
        probes={"liveness": {"periodSeconds": 5, "failureThreshold": 2, "timeoutSeconds": 2},
                "readiness": {"periodSeconds": 3, "timeoutSeconds": 1}},
        podSecurityContext={},
        securityContext={"readOnlyRootFilesystem": False},
    )
    (worker,) = pod["containers"]
    assert {"name": "NCCL_DEBUG", "value": "INFO"} == worker["env"][-1] and pod["hostIPC"] is False
    assert {v["name"]: v for v in pod["volumes"]}["dshm"]["emptyDir"]["sizeLimit"] == "8Gi"
    live, ready = worker["livenessProbe"], worker["readinessProbe"]
    assert (live["periodSeconds"], live["timeoutSeconds"], live["failureThreshold"]) == (5, 2, 2)
    assert (ready["periodSeconds"], ready["timeoutSeconds"], ready["failureThreshold"]) == (3, 1, 2)
    # OpenShift: no fixed UID, and still restricted
    assert pod["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    assert worker["securityContext"]["readOnlyRootFilesystem"] is False
    assert worker["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    dep = children(OWNER, parse_spec({"model": {"name": "smol"}, "jsonPatches": [
        {"op": "add", "path": "/metadata/annotations/team", "value": "search"}]}, "smol")).deployment
    assert dep["spec"]["template"]["metadata"]["annotations"]["team"] == "search"


def test_defaults_are_restricted_with_the_images_user() -> None:
    pod = worker_pod()
    assert pod["securityContext"]["runAsUser"] == 10001 and pod["securityContext"]["runAsNonRoot"] is True
    (worker,) = pod["containers"]
    assert worker["lifecycle"]["preStop"] == {"sleep": {"seconds": 10}}  # no sleep binary needed
    assert {v["name"]: v for v in pod["volumes"]}["dshm"]["emptyDir"]["sizeLimit"] == "1Gi"


def test_the_podsecuritycontext_also_runs_the_router_and_the_download_job() -> None:
    raw = {"model": {"name": "m", "url": "hf://o/n", "cache": {"size": "5Gi"}}, "router": {"enabled": True},
           "podSecurityContext": {"runAsUser": 1000680000}}
    spec = parse_spec(raw, "smol")
    router = children(OWNER, spec, cached="k").router.deployment["spec"]["template"]["spec"]
    job = download_job(OWNER, spec, WorkerDefaults(), "c")["spec"]["template"]["spec"]
    for pod in (router, job):
        assert pod["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"},
                                          "runAsUser": 1000680000}


def test_a_json_patch_that_does_not_apply_is_a_spec_problem() -> None:
    from hetero_infer.operator.spec import SpecError

    spec = parse_spec({"model": {"name": "m"}, "jsonPatches": [{"op": "replace", "path": "/spec/nothing", "value": 1}]})
    with pytest.raises(SpecError) as info:
        children(OWNER, spec)
    assert info.value.problems[0].startswith("spec.jsonPatches: does not apply")


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_escape_hatch_renders_valid_objects(version: str) -> None:
    spec = parse_spec({"model": {"name": "m"}, "resources": {"gpus": 1, "gpuResource": "nvidia.com/mig-1g.10gb"},
                       "engine": {"extraArgs": ["--enable-prefix-caching"]}, "shmSize": "16Gi",
                       "probes": {"liveness": {"periodSeconds": 15}}, "podSecurityContext": {"fsGroup": 2000},
                       "securityContext": {"capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}},
                       "jsonPatches": [{"op": "add", "path": "/spec/dnsPolicy", "value": "ClusterFirst"}],
                       "router": {"enabled": True}}, "smol")
    for manifest in children(OWNER, spec).all():
        kubernetes_validate.validate(strip_none(manifest), version, strict=True)


# -- through the real operator (kopf) against the API emulator ----------------------------------------------------

async def test_the_escape_hatch_through_the_operator(kmock: Any, operator: Any) -> None:
    """A patch that does not apply leaves the children alone and says why (Degraded, InvalidSpec); fixed, the
    extra flag and the patch reach the worker Deployment."""
    from kmock_cluster import DEPLOYMENTS, INFD, wait_for
    from test_operator_kmock import NS, create, events, infd, live, patch

    await operator()
    await create(kmock, infd(engine={"extraArgs": ["--enable-prefix-caching"]},
                             jsonPatches=[{"op": "replace", "path": "/spec/containers/7/image", "value": "x"}]))
    status = await wait_for(lambda: (live(kmock, INFD) or {}).get("status", {}).get("conditions")
                            and live(kmock, INFD)["status"], what="a degraded status")
    degraded = next(cd for cd in status["conditions"] if cd["type"] == "Degraded")
    assert degraded["reason"] == "InvalidSpec" and "spec.jsonPatches" in degraded["message"]
    assert live(kmock, DEPLOYMENTS) is None
    # kopf posts events from a queue of its own: the event may land after the status
    await wait_for(lambda: any(e.get("reason") == "InvalidSpec" for e in events(kmock)), what="the InvalidSpec event")
    await patch(kmock, f"/apis/{c.API_VERSION}/namespaces/{NS}/{c.PLURAL}/smol", {"spec": {"jsonPatches": [
        {"op": "add", "path": "/spec/containers/0/env/-", "value": {"name": "NCCL_DEBUG", "value": "INFO"}}]}})
    dep = await wait_for(lambda: live(kmock, DEPLOYMENTS), what="the worker Deployment")
    (worker,) = dep["spec"]["template"]["spec"]["containers"]
    assert worker["args"][-1] == "--enable-prefix-caching"
    assert {"name": "NCCL_DEBUG", "value": "INFO"} in worker["env"]


# -- routers and exposure -------------------------------------------------------------------------------------------

ROUTER_POD = {
    "nodeSelector": {"node-pool": "system"},
    "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}],
    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                   "whenUnsatisfiable": "ScheduleAnyway",
                                   "labelSelector": {"matchLabels": {"app.kubernetes.io/component": "router"}}}],
    "priorityClassName": "system-cluster-critical",
    "podAnnotations": {"sidecar.istio.io/inject": "false"},
    "podLabels": {"team": "ml"},
}
INTERNAL_LB = {"type": "LoadBalancer", "loadBalancerClass": "service.k8s.aws/nlb",
               "annotations": {"service.beta.kubernetes.io/aws-load-balancer-scheme": "internal"},
               "loadBalancerSourceRanges": ["10.0.0.0/8"]}


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_router_pods_are_placed_and_spread_and_exposed_internally(version: str) -> None:
    ch = children(OWNER, parse_spec({"model": {"name": "smol"}, "router": {"enabled": True, **ROUTER_POD},
                                     "service": INTERNAL_LB}, "smol"))
    tmpl = ch.router.deployment["spec"]["template"]
    pod = tmpl["spec"]
    assert pod["nodeSelector"] == ROUTER_POD["nodeSelector"] and pod["tolerations"] == ROUTER_POD["tolerations"]
    assert pod["topologySpreadConstraints"] == ROUTER_POD["topologySpreadConstraints"]
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert tmpl["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
    assert tmpl["metadata"]["labels"]["team"] == "ml"
    # without an affinity of its own, replicas prefer different nodes
    term = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"].items() <= tmpl["metadata"]["labels"].items()
    svc = ch.service["spec"]
    assert svc["type"] == "LoadBalancer" and svc["loadBalancerClass"] == "service.k8s.aws/nlb"
    assert svc["loadBalancerSourceRanges"] == ["10.0.0.0/8"]
    assert ch.service["metadata"]["annotations"]["service.beta.kubernetes.io/aws-load-balancer-scheme"] == "internal"
    assert ch.router.pdb is not None
    for manifest in ch.all():
        kubernetes_validate.validate(strip_none(manifest), version, strict=True)


def test_a_router_affinity_of_the_users_replaces_the_spreading() -> None:
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["edge"]}]}]}}}
    ch = children(OWNER, parse_spec({"model": {"name": "m"}, "router": {"enabled": True, "affinity": affinity}}, "m"))
    assert ch.router.deployment["spec"]["template"]["spec"]["affinity"] == affinity


def test_one_router_replica_gets_no_budget_that_would_let_it_be_evicted() -> None:
    ch = children(OWNER, parse_spec({"model": {"name": "m"}, "router": {"enabled": True, "replicas": 1}}, "m"))
    assert ch.router.pdb is None and all(m["kind"] != "PodDisruptionBudget" or m["metadata"]["name"] == "smol"
                                         for m in ch.all())


@pytest.mark.parametrize(("service", "needle"), [
    ({"loadBalancerClass": "service.k8s.aws/nlb"}, "LoadBalancer only"),
    ({"type": "LoadBalancer", "loadBalancerClass": "nlb"}, "loadBalancerClass"),
    ({"type": "NodePort", "loadBalancerSourceRanges": ["10.0.0.0/8"]}, "LoadBalancer only"),
])
def test_load_balancer_fields_need_a_load_balancer(crd: dict[str, Any], service: dict, needle: str) -> None:
    from crd_validation import validate

    from hetero_infer.operator.spec import SpecError

    obj = {"apiVersion": c.API_VERSION, "kind": c.KIND, "metadata": {"name": "m", "namespace": "d"},
           "spec": {"model": {"name": "m"}, "service": service}}
    assert any(needle in e for e in validate(crd, obj)), validate(crd, obj)
    with pytest.raises(SpecError) as info:
        parse_spec(obj["spec"], "m")
    assert any(needle in p for p in info.value.problems)


async def test_router_replicas_down_to_one_delete_its_budget(kmock: Any, operator: Any) -> None:
    from kmock_cluster import PDBS, SERVICES, wait_for
    from test_operator_kmock import NS, create, infd, live, patch

    await operator()
    await create(kmock, infd(router={"enabled": True}, service=INTERNAL_LB))
    await wait_for(lambda: live(kmock, PDBS, "smol-router"), what="the router's budget")
    svc = await wait_for(lambda: live(kmock, SERVICES), what="the Service")
    assert svc["spec"]["loadBalancerClass"] == "service.k8s.aws/nlb"
    await patch(kmock, f"/apis/{c.API_VERSION}/namespaces/{NS}/{c.PLURAL}/smol",
                {"spec": {"router": {"replicas": 1}, "service": {"annotations": None}}})
    await wait_for(lambda: live(kmock, PDBS, "smol-router") is None, what="the router's budget deleted")
    assert live(kmock, PDBS, "smol") is not None  # the workers' stays
    await wait_for(lambda: "service.beta.kubernetes.io/aws-load-balancer-scheme" not in (
        live(kmock, SERVICES)["metadata"].get("annotations") or {}),
        what="the dropped Service annotation removed")


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize(("modes", "replicas"), [(["ReadWriteOnce", "ReadOnlyMany"], 3), (["ReadWriteOnce"], 1)])
def test_the_cache_claims_access_modes_and_volume(modes: list[str], replicas: int, version: str) -> None:
    from hetero_infer.operator.manifests.cache import cache_claim

    spec = parse_spec({"model": {"name": "m", "url": "hf://o/n", "cache": {
        "size": "50Gi", "accessModes": modes, "volumeName": "models-pd", "storageClassName": "standard-rwo"}},
        "replicas": replicas}, "smol")
    claim = cache_claim(OWNER, spec)
    assert claim["spec"]["accessModes"] == modes and claim["spec"]["volumeName"] == "models-pd"
    kubernetes_validate.validate(strip_none(claim), version, strict=True)

"""The pod-level fields (spec_pod.py), the API keys from Secrets and the routers' stopping: rendered where they
belong, accepted by the Kubernetes schemas, and absent when unset, so an operator upgrade rolls no worker."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from crd_validation import defaulted, validate

from hetero_infer.operator.diff import fingerprint, strip_none
from hetero_infer.operator.manifests import Owner, children, command_line
from hetero_infer.operator.spec import parse_spec

OWNER = Owner("smol", "models", "uid-1")
K8S_VERSIONS = ["1.30.0", kubernetes_validate.latest_version()]
ROOT = Path(__file__).resolve().parents[2]

# The children the operator rendered before these fields existed (main at f3ab0a4, the commit before them:
# `children(Owner("smol", "models", "uid-1"), parse_spec(SPEC, "smol"))`, `diff.fingerprint` of each). A
# difference here rolls every such worker in every cluster at the operator's upgrade: make it on purpose.
# Rolled on purpose once since: the worker container's terminationMessagePolicy FallbackToLogsOnError (issue 44: a
# worker whose engine died exits 1 with the error as its pod's termination message), and the preStop as Kubernetes' own
# sleep action instead of exec'ing a `sleep` the image may lack (issue 44; needs Kubernetes 1.30+).
BEFORE = {
    "cpu": ({"model": {"name": "smol"}}, {
        "Deployment": "2120c2d0fd8051577ced8eec65cae224", "Service": "42f27a0ca16a660644ce302f81ce94b2",
        "PodDisruptionBudget": "a11945136c329513c5de7512cad966db"}),
    # With a nodeSelector the Deployment's metadata gains the spec-keys annotation (one metadata patch at the
    # upgrade, so that a key dropped later is removed); its spec, the pods included, is what it was.
    "gpu, pvc, engine": ({"model": {"name": "llama", "pvc": {"claimName": "models", "subPath": "llama"}},
                          "resources": {"gpus": 1}, "engine": {"dtype": "bfloat16", "maxModelLen": 4096,
                                                               "memoryThreshold": 0.85},
                          "env": [{"name": "A", "value": "b"}], "nodeSelector": {"gpu": "h100"}}, {
        "Deployment.spec": "42bd2536431ba5e815b7f1c546bb1bc2", "Service": "42f27a0ca16a660644ce302f81ce94b2",
        "PodDisruptionBudget": "a11945136c329513c5de7512cad966db"}),
    "hpa": ({"model": {"name": "m"}, "executor": "mock",
             "autoscaling": {"enabled": True, "mode": "hpa", "minReplicas": 1, "maxReplicas": 4}}, {
        "Deployment": "234124957b8647622d93fd59f8ebc6b5", "Service": "42f27a0ca16a660644ce302f81ce94b2",
        "PodDisruptionBudget": "a11945136c329513c5de7512cad966db",
        "HorizontalPodAutoscaler": "03c81be90510bf755faf5ebd90cb6600"}),
    "router (its workers)": ({"model": {"name": "m", "path": "/models/m"}, "router": {"enabled": True}}, {
        "Deployment": "b3778d712c8be9594edc042ebf793b61", "PodDisruptionBudget": "a11945136c329513c5de7512cad966db"}),
}

KNOBS = {
    "imagePullSecrets": [{"name": "registry"}],
    "serviceAccountName": "model-reader",
    "priorityClassName": "inference-high",
    "runtimeClassName": "nvidia",
    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                   "whenUnsatisfiable": "ScheduleAnyway",
                                   "labelSelector": {"matchLabels": {"hetero-infer.io/inference-deployment": "smol"}}}],
    "podAnnotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"},
    "podLabels": {"team": "search"},
    "volumes": [{"name": "adapters", "configMap": {"name": "adapters"}}],
    "volumeMounts": [{"name": "adapters", "mountPath": "/adapters", "readOnly": True}],
    "startupTimeoutSeconds": 1805,
    "drainSeconds": 600,
    "terminationGracePeriodSeconds": 630,
    "apiKey": {"secretKeyRef": {"name": "model-keys", "key": "workers"}},
}


def rendered(**raw: Any):
    return children(OWNER, parse_spec({"model": {"name": "smol"}, **raw}, "smol"))


def by_kind(raw: dict[str, Any]) -> dict[str, str]:
    out = {}
    for m in children(OWNER, parse_spec(raw, "smol")).all():
        if not m["metadata"]["name"].endswith("-router") and m["metadata"]["name"] != "smol-workers":
            out[m["kind"]] = fingerprint(m)
            if m["kind"] == "Deployment":
                out["Deployment.spec"] = fingerprint({"metadata": {}, "spec": m["spec"]})
    return out


@pytest.mark.parametrize("case", list(BEFORE), ids=list(BEFORE))
def test_specs_without_the_new_fields_render_what_they_did(case: str) -> None:
    raw, want = BEFORE[case]
    got = {k: v for k, v in by_kind(raw).items() if k in want or k == "Service"}
    if "router" in case:
        got.pop("Service")  # the router's Service; its Deployment rolls on purpose (replicas, preStop, grace)
    assert got == want


def test_the_server_filled_defaults_render_the_same_as_a_bare_spec(crd: dict[str, Any]) -> None:
    """The API server fills drainSeconds and startupTimeoutSeconds from the CRD: that must not roll either."""
    obj = {"apiVersion": "hetero-infer.io/v1alpha1", "kind": "InferenceDeployment",
           "metadata": {"name": "smol", "namespace": "models"}, "spec": {"model": {"name": "smol"}}}
    filled = defaulted(crd, obj)["spec"]
    assert filled["drainSeconds"] == 45 and filled["startupTimeoutSeconds"] == 900
    assert {k: v for k, v in by_kind(filled).items() if k != "Deployment.spec"} == BEFORE["cpu"][1]


def test_every_knob_lands_in_the_worker_pod() -> None:
    ch = rendered(**KNOBS)
    pod = ch.deployment["spec"]["template"]
    spec, (container,) = pod["spec"], pod["spec"]["containers"]
    assert spec["imagePullSecrets"] == [{"name": "registry"}]
    assert (spec["serviceAccountName"], spec["priorityClassName"], spec["runtimeClassName"]) == (
        "model-reader", "inference-high", "nvidia")
    assert spec["topologySpreadConstraints"] == KNOBS["topologySpreadConstraints"]
    assert pod["metadata"]["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"
    assert pod["metadata"]["labels"]["team"] == "search"
    assert pod["metadata"]["labels"]["hetero-infer.io/inference-deployment"] == "smol"  # ours kept
    assert {"name": "adapters", "configMap": {"name": "adapters"}} in spec["volumes"]
    assert {"name": "adapters", "mountPath": "/adapters", "readOnly": True} in container["volumeMounts"]
    # Stopping: the worker drains for drainSeconds after the preStop, within the grace period.
    assert spec["terminationGracePeriodSeconds"] == 630
    args = container["args"]
    assert args[args.index("--shutdown-grace") + 1] == "600"
    sleep = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert sleep + 600 <= 630
    probe = container["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] >= 1805 > probe["periodSeconds"] * (
        probe["failureThreshold"] - 1)
    # The key from its Secret, in the environment the worker reads (HETERO_INFER_API_KEY), never in the args.
    assert {"name": "HETERO_INFER_API_KEY",
            "valueFrom": {"secretKeyRef": {"name": "model-keys", "key": "workers"}}} in container["env"]
    assert "--api-key" not in command_line(parse_spec({"model": {"name": "smol"}, **KNOBS}, "smol"))


def test_the_grace_period_follows_the_drain_when_only_the_drain_is_given() -> None:
    spec = rendered(drainSeconds=1200).deployment["spec"]["template"]["spec"]
    assert spec["terminationGracePeriodSeconds"] == 10 + 1200 + 5


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_children_with_every_knob_validate_against_the_kubernetes_schemas(version: str) -> None:
    for manifest in rendered(**KNOBS, router={"enabled": True,
                                              "apiKey": {"secretKeyRef": {"name": "k", "key": "r"}}}).all():
        if manifest["kind"] == "InferencePool":
            continue
        kubernetes_validate.validate(strip_none(manifest), version, strict=True)


def test_the_router_gets_both_keys_from_their_secrets() -> None:
    router = rendered(apiKey=KNOBS["apiKey"], router={
        "enabled": True, "apiKey": {"secretKeyRef": {"name": "router-keys", "key": "clients"}}}).router
    (container,) = router.deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("valueFrom") for e in container["env"]}
    assert env["HETERO_INFER_ROUTER_WORKER_API_KEY"] == {"secretKeyRef": {"name": "model-keys", "key": "workers"}}
    assert env["HETERO_INFER_ROUTER_API_KEY"] == {"secretKeyRef": {"name": "router-keys", "key": "clients"}}
    assert not any("key" in a for a in container["args"])


def test_the_router_survives_drains_and_rollouts() -> None:
    """Two replicas by default, at most one disrupted at a time, a preStop so endpoints drop it before SIGTERM,
    and a grace period that lets a request held for the whole hold time-out still finish."""
    router = rendered(router={"enabled": True, "holdTimeoutSeconds": 200}).router
    dep = router.deployment["spec"]
    assert dep["replicas"] == 2
    assert dep["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert router.pdb["spec"]["maxUnavailable"] == 1
    assert router.pdb["spec"]["selector"] == dep["selector"]
    pod = dep["template"]["spec"]
    (container,) = pod["containers"]
    prestop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    args = container["args"]
    drain = float(args[args.index("--shutdown-grace-s") + 1])
    assert drain >= 200 and pod["terminationGracePeriodSeconds"] > prestop + drain


def test_the_router_pdb_goes_with_the_router() -> None:
    from hetero_infer.operator.manifests import router_child_names

    kinds = {kind for kind, _ in router_child_names("smol")}
    assert {m["kind"] for m in rendered(router={"enabled": True}).router.all()} <= kinds | {"Service"}
    assert "PodDisruptionBudget" in kinds


def test_the_examples_leave_replicas_to_the_autoscaler() -> None:
    """A re-apply (or a GitOps tool correcting drift) of an example with spec.replicas beside autoscaling would
    overwrite the autoscaler's choice."""
    import yaml

    for path in sorted((ROOT / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "InferenceDeployment":
                spec = doc["spec"]
                if (spec.get("autoscaling") or {}).get("enabled"):
                    assert "replicas" not in spec, f"{path.name}: spec.replicas beside autoscaling"


def test_the_crd_accepts_every_knob(crd: dict[str, Any]) -> None:
    obj = {"apiVersion": "hetero-infer.io/v1alpha1", "kind": "InferenceDeployment",
           "metadata": {"name": "smol", "namespace": "models"}, "spec": {"model": {"name": "smol"}, **KNOBS}}
    assert validate(crd, json.loads(json.dumps(obj))) == []


# -- the real operator (kopf) against the API emulator ------------------------------------------------------
async def test_the_operator_adds_and_removes_knobs_and_rolls_nothing_for_defaults(kmock: Any, operator: Any) -> None:
    from kmock_cluster import DEPLOYMENTS, INFD, wait_for
    from test_operator_kmock import NS, child_writes, container, create, infd, live, patch

    from hetero_infer.operator import constants as c

    await operator("--resync-seconds", "0.2")
    await create(kmock, infd())
    await wait_for(lambda: live(kmock, DEPLOYMENTS) and live(kmock, INFD).get("status", {}).get("conditions"),
                   what="children and status")
    path = f"/apis/{c.API_VERSION}/namespaces/{NS}/{c.PLURAL}/smol"

    def observed(generation: int) -> Any:
        return lambda: (live(kmock, INFD) or {}).get("status", {}).get("observedGeneration") == generation

    # The defaults written out (what a CRD with defaults stores): no child is written.
    before = child_writes(kmock)
    await patch(kmock, path, {"spec": {"drainSeconds": 45, "startupTimeoutSeconds": 900}})
    await wait_for(observed(2), what="the spec with its defaults written out reconciled")
    assert child_writes(kmock) == before

    # The knobs: the worker pods get them.
    await patch(kmock, path, {"spec": {"imagePullSecrets": [{"name": "registry"}], "podLabels": {"team": "a"},
                                       "apiKey": {"secretKeyRef": {"name": "keys", "key": "workers"}},
                                       "drainSeconds": 300}})
    await wait_for(lambda: (live(kmock, DEPLOYMENTS)["spec"]["template"]["spec"].get("imagePullSecrets")
                            == [{"name": "registry"}]), what="imagePullSecrets on the worker pods")
    template = live(kmock, DEPLOYMENTS)["spec"]["template"]
    assert template["metadata"]["labels"]["team"] == "a"
    assert template["spec"]["terminationGracePeriodSeconds"] == 315
    assert {"name": "HETERO_INFER_API_KEY",
            "valueFrom": {"secretKeyRef": {"name": "keys", "key": "workers"}}} in container(kmock)["env"]

    # Removed again: the operator takes them off the live Deployment.
    await patch(kmock, path, {"spec": {"imagePullSecrets": None, "podLabels": None, "apiKey": None,
                                       "drainSeconds": None}})
    await wait_for(lambda: "imagePullSecrets" not in live(kmock, DEPLOYMENTS)["spec"]["template"]["spec"],
                   what="imagePullSecrets removed")
    template = live(kmock, DEPLOYMENTS)["spec"]["template"]
    assert "team" not in template["metadata"]["labels"]
    assert template["spec"]["terminationGracePeriodSeconds"] == 60
    assert not [e for e in container(kmock)["env"] if e["name"] == "HETERO_INFER_API_KEY"]


def test_a_pod_label_dropped_from_the_spec_is_removed_and_others_are_left_alone() -> None:
    """podLabels share the template's labels with the operator's own and with what other tools add: the merge
    patch removes exactly the keys the spec had (the child's spec-keys annotation) and no longer has."""
    from hetero_infer.operator.constants import SPEC_KEYS_ANNOTATION
    from hetero_infer.operator.diff import merge_patch, with_fingerprint

    live = with_fingerprint(rendered(podLabels={"team": "a", "tier": "gold"}, podAnnotations={"x": "1"}).deployment)
    live["spec"]["template"]["metadata"]["labels"]["added-by-someone-else"] = "v"
    live["spec"]["template"]["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"] = "now"
    desired = with_fingerprint(rendered(podLabels={"team": "b"}).deployment)
    patch = merge_patch(desired, live)
    template = patch["spec"]["template"]["metadata"]
    assert template["labels"]["team"] == "b" and template["labels"]["tier"] is None
    assert "added-by-someone-else" not in template["labels"]
    assert template["annotations"]["x"] is None and "kubectl.kubernetes.io/restartedAt" not in template["annotations"]
    assert patch["metadata"]["annotations"][SPEC_KEYS_ANNOTATION] == '{"spec.template.metadata.labels":["team"]}'
    # Without podLabels and podAnnotations the annotation goes too.
    assert merge_patch(with_fingerprint(rendered().deployment), live)["metadata"]["annotations"][
        SPEC_KEYS_ANNOTATION] is None


def test_a_node_selector_key_dropped_from_the_spec_is_removed() -> None:
    from hetero_infer.operator.diff import merge_patch, with_fingerprint

    live = with_fingerprint(rendered(nodeSelector={"gpu": "h100", "zone": "a"}).deployment)
    patch = merge_patch(with_fingerprint(rendered(nodeSelector={"gpu": "h100"}).deployment), live)
    assert patch["spec"]["template"]["spec"]["nodeSelector"] == {"gpu": "h100", "zone": None}
    patch = merge_patch(with_fingerprint(rendered().deployment), live)
    assert patch["spec"]["template"]["spec"]["nodeSelector"] is None  # all of it, as before

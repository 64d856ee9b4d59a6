"""spec.router -> the router's children (pure), and one reconcile pass turning the router on and off."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
from test_operator_reconcile import FakeClient, infd, run

from hetero_infer.operator import constants as c
from hetero_infer.operator.diff import strip_none
from hetero_infer.operator.manifests import (
    Owner,
    WorkerDefaults,
    children,
    router_args,
    router_child_names,
    selector_labels,
)
from hetero_infer.operator.spec import parse_spec

OWNER = Owner("smol", "models", "0000-1111")
K8S_VERSIONS = ["1.30.0", kubernetes_validate.latest_version()]


def spec(**raw: Any) -> Any:
    return parse_spec({"model": {"name": "smollm2"}, **raw})


def test_without_the_router_the_service_selects_the_workers_and_nothing_else_is_rendered() -> None:
    kids = children(OWNER, spec())
    assert kids.router is None and kids.inference_pool is None
    assert kids.service["spec"]["selector"] == selector_labels("smol") == kids.deployment["spec"]["selector"][
        "matchLabels"]
    assert {m["kind"] for m in kids.all()} == {"Deployment", "Service", "PodDisruptionBudget"}


def test_with_the_router_users_call_the_router_and_the_router_discovers_the_workers_service() -> None:
    kids = children(OWNER, spec(router={"enabled": True, "replicas": 2, "policy": "least-load",
                                        "holdTimeoutSeconds": 90}, engine={"blockSize": 32}),
                    WorkerDefaults(router_image="registry.local/op:1"))
    r = kids.router
    assert r is not None
    router_pods = r.deployment["spec"]["template"]
    # The Service users call (same name, same endpoint) now selects the router pods.
    assert kids.service["metadata"]["name"] == "smol"
    assert kids.service["spec"]["selector"] == r.deployment["spec"]["selector"]["matchLabels"]
    assert kids.service["spec"]["selector"] == {c.LABEL_OWNER: "smol", c.LABEL_COMPONENT: c.COMPONENT_ROUTER}
    assert all(router_pods["metadata"]["labels"][k] == v for k, v in kids.service["spec"]["selector"].items())
    # The workers keep a Service of their own: headless, selecting the worker pods on their HTTP port.
    ws = r.workers_service
    assert ws["metadata"]["name"] == "smol-workers"
    assert ws["spec"]["selector"] == kids.deployment["spec"]["selector"]["matchLabels"]
    assert ws["spec"]["clusterIP"] == "None"
    assert ws["spec"]["ports"][0]["targetPort"] == "http"
    assert ws["metadata"]["labels"][c.LABEL_COMPONENT] == c.COMPONENT_WORKER  # what a ServiceMonitor selects
    dep = r.deployment
    assert dep["metadata"]["name"] == "smol-router" and dep["spec"]["replicas"] == 2
    ctr = router_pods["spec"]["containers"][0]
    assert ctr["image"] == "registry.local/op:1"
    assert ctr["args"] == router_args(OWNER, spec(router={"enabled": True, "replicas": 2, "policy": "least-load",
                                                          "holdTimeoutSeconds": 90}, engine={"blockSize": 32}))
    args = ctr["args"]
    assert args[0] == "router"
    assert args[args.index("--discover-service") + 1] == "smol-workers"
    assert args[args.index("--namespace") + 1] == "models"
    assert args[args.index("--policy") + 1] == "least-load"
    assert args[args.index("--hold-timeout-s") + 1] == "90"
    assert args[args.index("--block-size") + 1] == "32"  # the workers' block size: exact prefix hashes
    assert ctr["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert ctr["securityContext"]["readOnlyRootFilesystem"] is True
    # Only the router pods carry an API token, and it belongs to the router's own ServiceAccount.
    assert router_pods["spec"]["serviceAccountName"] == r.service_account["metadata"]["name"] == "smol-router"
    assert router_pods["spec"]["automountServiceAccountToken"] is True
    assert kids.deployment["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    for m in r.all():
        assert m["metadata"]["namespace"] == "models"
        assert m["metadata"]["ownerReferences"][0]["uid"] == "0000-1111"


def test_router_rbac_is_read_only_endpointslices_in_its_namespace() -> None:
    r = children(OWNER, spec(router={"enabled": True})).router
    assert r is not None
    assert r.role["kind"] == "Role"  # namespaced: never a ClusterRole
    granted = {(g, res, v) for rule in r.role["rules"] for g in rule["apiGroups"] for res in rule["resources"]
               for v in rule["verbs"]}
    assert granted == {("discovery.k8s.io", "endpointslices", v) for v in ("get", "list", "watch")}
    b = r.role_binding
    assert b["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "smol-router"}
    assert b["subjects"] == [{"kind": "ServiceAccount", "name": "smol-router", "namespace": "models"}]


def test_default_router_resources_and_image() -> None:
    r = children(OWNER, spec(router={"enabled": True})).router
    assert r is not None
    ctr = r.deployment["spec"]["template"]["spec"]["containers"][0]
    assert ctr["image"] == c.DEFAULT_ROUTER_IMAGE
    assert ctr["resources"] == {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "512Mi"}}
    assert "--block-size" not in ctr["args"]
    custom = children(OWNER, spec(router={"enabled": True, "image": "mine:2", "resources": {"cpu": 2,
                                                                                         "memory": "1Gi"}})).router
    assert custom is not None
    cc = custom.deployment["spec"]["template"]["spec"]["containers"][0]
    assert cc["image"] == "mine:2" and cc["resources"]["requests"] == {"cpu": "2", "memory": "1Gi"}


def test_inference_pool_selects_the_workers_and_names_the_endpoint_picker() -> None:
    pool = children(OWNER, spec(router={"inferencePool": {"endpointPicker": "epp", "endpointPickerPort": 9100}}))
    p = pool.inference_pool
    assert p is not None and p["apiVersion"] == "inference.networking.k8s.io/v1" and p["kind"] == "InferencePool"
    assert p["spec"]["selector"] == {"matchLabels": selector_labels("smol")}
    assert p["spec"]["targetPorts"] == [{"number": c.WORKER_PORT}]
    assert p["spec"]["endpointPickerRef"]["name"] == "epp"
    assert p["spec"]["endpointPickerRef"]["port"] == {"number": 9100}


ROUTER_SPECS = {
    "router": {"router": {"enabled": True}},
    "scale-to-zero": {"router": {"enabled": True, "replicas": 3, "resources": {"cpu": "250m"}},
                      "autoscaling": {"enabled": True, "minReplicas": 0, "maxReplicas": 3}},
    "cors-and-tokenizer": {"router": {"enabled": True, "tokenizer": "none",
                                      "cors": {"allowedOrigins": ["https://app.example.com"],
                                               "allowedHeaders": ["authorization"], "allowCredentials": True}}},
}


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("name", list(ROUTER_SPECS))
def test_every_router_child_validates_against_the_kubernetes_schemas(name: str, version: str) -> None:
    kids = children(OWNER, spec(**ROUTER_SPECS[name]))
    assert kids.router is not None
    kinds = set()
    for manifest in kids.all():
        kubernetes_validate.validate(strip_none(manifest), version, strict=True)
        kinds.add(manifest["kind"])
    assert {"ServiceAccount", "Role", "RoleBinding"} <= kinds


def test_the_router_cli_accepts_the_generated_command_line() -> None:
    """Contract with `hetero-infer router`: its own parser reads what the operator writes."""
    from hetero_infer.router.cli import resolve_options

    s = spec(router={"enabled": True, "policy": "round-robin", "holdTimeoutSeconds": 45}, engine={"blockSize": 8})
    args = router_args(OWNER, s)
    options = resolve_options(args[1:], environ={})
    assert (options.host, options.port) == ("0.0.0.0", c.WORKER_PORT)
    assert options.policy == "round-robin" and options.hold_timeout_s == 45 and options.block_size == 8
    assert options.discover_service == "smol-workers" and options.namespace == "models"
    assert options.worker == []


def test_turning_the_router_on_creates_its_children_and_off_deletes_them() -> None:
    client = FakeClient()
    body = infd(client, router={"enabled": True})
    run(client)
    names = {(kind, name) for kind, _, name in client.objects}
    assert set(router_child_names("smol")) <= names
    assert client.objects[("Service", "ns", "smol")]["spec"]["selector"][c.LABEL_COMPONENT] == c.COMPONENT_ROUTER
    body["spec"]["router"] = {"enabled": False}
    body["metadata"]["generation"] = 2
    run(client)
    names = {(kind, name) for kind, _, name in client.objects}
    assert not set(router_child_names("smol")) & names
    assert client.objects[("Service", "ns", "smol")]["spec"]["selector"][c.LABEL_COMPONENT] == c.COMPONENT_WORKER
    assert ("Deployment", "smol") in names  # the workers stay


def test_a_failed_removal_keeps_the_router_in_front_and_is_retried() -> None:
    client = FakeClient()
    body = infd(client, router={"enabled": True, "inferencePool": {"endpointPicker": "epp"}})
    run(client)
    assert ("InferencePool", "ns", "smol") in client.objects
    body["spec"]["router"] = {"enabled": False}
    body["metadata"]["generation"] = 2
    client.fail.add(("delete", "Role"))
    out = run(client)
    assert out.errors
    # The Service users call still selects the router (whose pods still run), and still records it.
    assert client.objects[("Service", "ns", "smol")]["spec"]["selector"][c.LABEL_COMPONENT] == c.COMPONENT_ROUTER
    client.fail.clear()
    run(client)
    names = {(kind, name) for kind, _, name in client.objects}
    assert not (set(router_child_names("smol")) | {("InferencePool", "smol")}) & names
    assert client.objects[("Service", "ns", "smol")]["spec"]["selector"][c.LABEL_COMPONENT] == c.COMPONENT_WORKER
    client.writes.clear()
    run(client)
    assert client.writes == []  # converged: nothing left to remove, nothing to write

"""One reconciliation pass against an in-memory fake API (no kopf, no HTTP)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import api_defaults

from hetero_infer.operator import constants as c
from hetero_infer.operator import kube
from hetero_infer.operator.diff import owned_by
from hetero_infer.operator.reconcile import reconcile

UID = "uid-1"


class FakeClient:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.writes: list[tuple[str, str, str, str | None]] = []  # (verb, kind, name, subresource)
        self.fail: set[tuple[str, str]] = set()  # (verb, kind) -> 500

    def _check(self, verb: str, kind: kube.Kind) -> None:
        if (verb, kind.kind) in self.fail:
            raise kube.ApiError(500, "InternalError", f"{verb} {kind.kind} failed")

    def get(self, kind: kube.Kind, namespace: str, name: str) -> dict[str, Any] | None:
        self._check("get", kind)
        obj = self.objects.get((kind.kind, namespace, name))
        return copy.deepcopy(obj) if obj else None

    def list(self, kind: kube.Kind, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        self._check("list", kind)
        want = dict(term.split("=", 1) for term in label_selector.split(",") if term)
        return [copy.deepcopy(o) for (k, ns, _), o in self.objects.items() if k == kind.kind and ns == namespace
                and want.items() <= ((o.get("metadata") or {}).get("labels") or {}).items()]

    def create(self, kind: kube.Kind, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self._check("create", kind)
        key = (kind.kind, namespace, body["metadata"]["name"])
        if key in self.objects:
            raise kube.ApiError(409, "AlreadyExists", "exists")
        self.objects[key] = copy.deepcopy(dict(body))
        self.writes.append(("create", kind.kind, key[2], None))
        return copy.deepcopy(self.objects[key])

    def patch(self, kind: kube.Kind, namespace: str, name: str, patch: Mapping[str, Any],
              subresource: str | None = None) -> dict[str, Any]:
        self._check("patch", kind)
        obj = self.objects[(kind.kind, namespace, name)]
        _merge(obj, copy.deepcopy(dict(patch)))
        self.writes.append(("patch", kind.kind, name, subresource))
        return copy.deepcopy(obj)

    def delete(self, kind: kube.Kind, namespace: str, name: str) -> bool:
        self._check("delete", kind)
        self.writes.append(("delete", kind.kind, name, None))
        return self.objects.pop((kind.kind, namespace, name), None) is not None


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, dict) and isinstance(target.get(k), dict):
            _merge(target[k], v)
        else:
            target[k] = v


def infd(client: FakeClient, **spec: Any) -> dict[str, Any]:
    body = {"apiVersion": c.API_VERSION, "kind": c.KIND,
            "metadata": {"name": "smol", "namespace": "ns", "uid": UID, "generation": 1},
            "spec": {"model": {"name": "m"}, **spec}}
    client.objects[(c.KIND, "ns", "smol")] = body
    return body


def current(client: FakeClient) -> dict[str, Any]:
    return copy.deepcopy(client.objects[(c.KIND, "ns", "smol")])


def run(client: FakeClient, events: list[tuple[str, str, str]] | None = None) -> Any:
    sink = events if events is not None else []
    return reconcile(current(client), client, lambda *e: sink.append(e), now="2026-01-01T00:00:00Z")


def test_first_pass_creates_children_and_status_second_pass_writes_nothing() -> None:
    client = FakeClient()
    infd(client)
    events: list[tuple[str, str, str]] = []
    out = run(client, events)
    assert sorted(w[1] for w in client.writes if w[0] == "create") == ["Deployment", "PodDisruptionBudget", "Service"]
    assert ("patch", c.KIND, "smol", "status") in client.writes
    assert current(client)["status"]["selector"] == out.status["selector"]
    assert [e[1] for e in events] == ["Created", "Created", "Created"]
    for kind in ("Deployment", "Service", "PodDisruptionBudget"):
        assert owned_by(client.objects[(kind, "ns", "smol")], UID)

    client.writes.clear()
    events.clear()
    run(client, events)
    assert client.writes == [] and events == []


def test_drift_is_patched_back_with_an_event() -> None:
    client = FakeClient()
    infd(client)
    run(client)
    dep = client.objects[("Deployment", "ns", "smol")]
    dep["spec"]["template"]["spec"]["containers"][0]["image"] = "evil:latest"
    dep["spec"]["template"]["spec"]["nodeSelector"] = {"x": "y"}
    events: list[tuple[str, str, str]] = []
    client.writes.clear()
    run(client, events)
    assert ("patch", "Deployment", "smol", None) in client.writes
    fixed = client.objects[("Deployment", "ns", "smol")]["spec"]["template"]["spec"]
    assert fixed["containers"][0]["image"] == c.DEFAULT_WORKER_IMAGE and "nodeSelector" not in fixed
    assert events and events[0][1] == "Updated" and "containers" in events[0][2]


def test_hpa_mode_creates_hpa_and_never_writes_the_replicas_it_owns() -> None:
    client = FakeClient()
    infd(client, replicas=1, autoscaling={"enabled": True, "mode": "hpa", "maxReplicas": 5})
    run(client)
    assert ("HorizontalPodAutoscaler", "ns", "smol") in client.objects
    client.objects[(c.KIND, "ns", "smol")]["spec"]["replicas"] = 4  # the HPA scaled us
    client.writes.clear()
    run(client)
    assert client.objects[("Deployment", "ns", "smol")]["spec"]["replicas"] == 4
    assert all(w[3] == "status" for w in client.writes if w[1] == c.KIND)
    assert current(client)["spec"]["replicas"] == 4

    client.objects[(c.KIND, "ns", "smol")]["spec"]["autoscaling"]["enabled"] = False
    events: list[tuple[str, str, str]] = []
    run(client, events)
    assert ("HorizontalPodAutoscaler", "ns", "smol") not in client.objects
    assert any(e[1] == "Deleted" for e in events)


def test_invalid_spec_touches_no_children() -> None:
    client = FakeClient()
    infd(client, replicas=-1)
    events: list[tuple[str, str, str]] = []
    out = run(client, events)
    assert out.invalid and not [w for w in client.writes if w[1] != c.KIND]
    assert events[0][:2] == ("Warning", "InvalidSpec")
    client.writes.clear()
    events.clear()
    run(client, events)
    assert client.writes == [] and events == []  # the same problem is reported once


def test_foreign_child_is_a_conflict() -> None:
    client = FakeClient()
    infd(client)
    client.objects[("Service", "ns", "smol")] = {"metadata": {"name": "smol", "namespace": "ns"}, "spec": {}}
    events: list[tuple[str, str, str]] = []
    out = run(client, events)
    assert [r.action for r in out.results if r.kind == "Service"] == ["conflict"]
    assert "ownerReferences" not in client.objects[("Service", "ns", "smol")]["metadata"]
    degraded = next(x for x in current(client)["status"]["conditions"] if x["type"] == "Degraded")
    assert degraded["reason"] == "ChildConflict"
    assert any(e[:2] == ("Warning", "ChildConflict") for e in events)


def test_api_errors_are_reported_for_retry_and_in_status() -> None:
    client = FakeClient()
    infd(client)
    client.fail.add(("create", "Service"))
    out = run(client)
    assert out.errors and "Service" in out.errors[0]
    degraded = next(x for x in current(client)["status"]["conditions"] if x["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "ReconcileFailed"


class DefaultingClient(FakeClient):
    """The fake API with kube-apiserver's defaulting (api_defaults.py) after every create and patch."""

    def __init__(self) -> None:
        super().__init__()
        self.patches: list[dict[str, Any]] = []

    def _default(self, kind: kube.Kind, namespace: str, name: str) -> dict[str, Any]:
        obj = self.objects[(kind.kind, namespace, name)]
        default = api_defaults.BY_KIND.get(kind.plural)
        if default is not None:
            default(obj)
        return copy.deepcopy(obj)

    def create(self, kind: kube.Kind, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        super().create(kind, namespace, body)
        return self._default(kind, namespace, body["metadata"]["name"])

    def patch(self, kind: kube.Kind, namespace: str, name: str, patch: Mapping[str, Any],
              subresource: str | None = None) -> dict[str, Any]:
        self.patches.append(copy.deepcopy(dict(patch)))
        super().patch(kind, namespace, name, patch, subresource)
        return self._default(kind, namespace, name)


def _nulls_in_lists(value: Any, inside_list: bool = False) -> list[Any]:
    if isinstance(value, Mapping):
        return [k for k, v in value.items() if v is None and inside_list] + [
            n for v in value.values() for n in _nulls_in_lists(v, inside_list)]
    if isinstance(value, list):
        return [n for v in value for n in ([v] if v is None else _nulls_in_lists(v, True))]
    return []


def test_server_defaults_are_not_drift() -> None:
    client = DefaultingClient()
    infd(client, autoscaling={"enabled": True, "mode": "hpa", "maxReplicas": 3}, service={"type": "NodePort"})
    run(client)
    dep = client.objects[("Deployment", "ns", "smol")]
    assert dep["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] == "IfNotPresent"  # defaulted
    for _ in range(3):
        client.writes.clear()
        events: list[tuple[str, str, str]] = []
        run(client, events)
        assert client.writes == [] and events == []


def test_a_field_the_spec_drops_is_removed_and_patches_carry_no_null_in_lists() -> None:
    client = DefaultingClient()
    infd(client, nodeSelector={"pool": "a"})
    run(client)
    client.objects[(c.KIND, "ns", "smol")]["spec"].pop("nodeSelector")
    run(client)
    pod = client.objects[("Deployment", "ns", "smol")]["spec"]["template"]["spec"]
    assert "nodeSelector" not in pod  # nothing else changed: only the fingerprint tells
    assert [p for p in client.patches if _nulls_in_lists(p)] == []  # no `imagePullPolicy: null`
    client.writes.clear()
    run(client)
    assert client.writes == []

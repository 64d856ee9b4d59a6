"""One reconciliation pass: spec -> children on the server -> status (no kopf in here).

`reconcile` is idempotent: it creates what is missing, patches what drifted from the spec, removes
an HPA that the spec no longer asks for, and writes its status fields only when they changed
(status.py says which are its own; the write is retried on a conflict, kube.patch_status). It never
raises for a bad spec (that becomes a Degraded condition); API failures are reported in the outcome
so the caller can retry with backoff.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from hetero_infer.operator import kube
from hetero_infer.operator.diff import differences, merge_patch, owned_by, strip_none, with_fingerprint
from hetero_infer.operator.manifests import (
    Owner,
    WorkerDefaults,
    children,
    endpoint,
    router_name,
    selector_string,
    stale_optional_children,
)
from hetero_infer.operator.spec import SpecError, parse_spec
from hetero_infer.operator.status import Observed, compute_status, invalid_spec_status, status_changed

# record(type, reason, message): posts a Kubernetes event on the InferenceDeployment.
Recorder = Callable[[str, str, str], None]


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: UP017 (py3.10)


@dataclass
class ChildResult:
    kind: str
    name: str
    action: str  # created | updated | unchanged | conflict
    live: dict[str, Any] | None
    detail: str = ""


@dataclass
class Outcome:
    status: dict[str, Any] | None
    results: list[ChildResult] = field(default_factory=list)
    invalid: list[str] = field(default_factory=list)  # spec problems (no retry helps)
    errors: list[str] = field(default_factory=list)  # API failures (retry later)


_READ = object()


def apply_child(client: kube.Client, desired: Mapping[str, Any], owner_uid: str, live: Any = _READ) -> ChildResult:
    """Create the child or bring the fields the operator owns back to `desired` (`live`: the object as just read,
    when the caller has it)."""
    desired = with_fingerprint(desired)
    kind = kube.kind_of(desired)
    meta = desired["metadata"]
    ns, name = meta["namespace"], meta["name"]
    if live is _READ:
        live = client.get(kind, ns, name)
    if live is None:
        try:
            return ChildResult(kind.kind, name, "created", client.create(kind, ns, strip_none(desired)))
        except kube.ApiError as e:
            if not e.conflict:
                raise
            live = client.get(kind, ns, name)  # created concurrently: compare with that one
            if live is None:
                raise
    if not owned_by(live, owner_uid):
        return ChildResult(kind.kind, name, "conflict", live,
                           f"{kind.kind} {ns}/{name} exists but is not owned by this InferenceDeployment; "
                           "rename or delete it")
    changed = differences(desired, live)
    if not changed:
        return ChildResult(kind.kind, name, "unchanged", live)
    patched = client.patch(kind, ns, name, merge_patch(desired, live))
    shown = ", ".join(p.lstrip(".") for p in changed[:4]) + (" ..." if len(changed) > 4 else "")
    return ChildResult(kind.kind, name, "updated", patched, shown)


def delete_owned(client: kube.Client, kind: kube.Kind, namespace: str, name: str, owner_uid: str) -> bool:
    """Delete a child if it exists and belongs to the owner; True when something was deleted."""
    live = client.get(kind, namespace, name)
    if live is None or not owned_by(live, owner_uid):
        return False
    return client.delete(kind, namespace, name)


def _identity(body: Mapping[str, Any]) -> tuple[str, str, str, int | None]:
    meta = body.get("metadata") or {}
    return meta["name"], meta.get("namespace") or "default", meta.get("uid") or "", meta.get("generation")


def write_status(client: kube.Client, body: Mapping[str, Any],
                 status_for: Callable[[Mapping[str, Any]], dict[str, Any]]) -> None:
    """Write `status_for(previous status)` over the object's latest version (kube.patch_status).

    Only while the spec is the one this pass reconciled: after a spec change, the pass for the
    new generation writes the status.
    """
    generation = _identity(body)[3]

    def compute(latest: Mapping[str, Any]) -> dict[str, Any] | None:
        if (latest.get("metadata") or {}).get("generation") != generation:
            return None
        previous = latest.get("status") or {}
        status = status_for(previous)
        return status if status_changed(previous, status) else None

    kube.patch_status(client, kube.INFERENCE_DEPLOYMENT, body, compute)


def reconcile(body: Mapping[str, Any], client: kube.Client, record: Recorder,
              defaults: WorkerDefaults | None = None, now: str | None = None) -> Outcome:
    """Make the children match the InferenceDeployment `body` and refresh its status."""
    now = now or utc_now()
    name, ns, uid, generation = _identity(body)
    previous = body.get("status") or {}
    selector = selector_string(name)

    try:
        spec = parse_spec(body.get("spec"), name=name)
    except SpecError as e:
        problems = e.problems

        def invalid(prev: Mapping[str, Any]) -> dict[str, Any]:
            return invalid_spec_status(previous=prev, generation=generation, problems=problems,
                                       selector=selector, now=now)

        status = invalid(previous)
        if status_changed(previous, status):
            record("Warning", "InvalidSpec", f"spec rejected, children left as they are: {e}")
            write_status(client, body, invalid)
        return Outcome(status=status, invalid=e.problems)

    owner = Owner(name, ns, uid)
    wanted = children(owner, spec, defaults)
    outcome = Outcome(status=None)
    live: dict[tuple[str, str], dict[str, Any] | None] = {}
    # The Service users call records which optional children (router, InferencePool) were rendered: those the
    # spec dropped are deleted before the Service is switched, so a failed deletion is retried next pass.
    service_live: Any = _READ
    skip_service = False
    try:
        service_live = client.get(kube.SERVICE, ns, name)
        owned = service_live if service_live is not None and owned_by(service_live, uid) else None
        for kind_name, child in stale_optional_children(owned, wanted):
            if delete_owned(client, kube.KINDS_BY_NAME[kind_name], ns, child, uid):
                record("Normal", "Deleted", f"deleted {kind_name} {ns}/{child} (no longer in the spec)")
    except kube.ApiError as e:
        outcome.errors.append(f"removing children the spec dropped in {ns}: {e}")
        skip_service = True
    for manifest in wanted.all():
        if manifest is wanted.service and skip_service:
            continue
        try:
            result = apply_child(client, manifest, uid, service_live if manifest is wanted.service else _READ)
        except kube.ApiError as e:
            outcome.errors.append(f"{manifest['kind']} {ns}/{manifest['metadata']['name']}: {e}")
            continue
        outcome.results.append(result)
        live[result.kind, result.name] = result.live
        if result.action == "created":
            record("Normal", "Created", f"created {result.kind} {ns}/{result.name}")
        elif result.action == "updated":
            record("Normal", "Updated", f"updated {result.kind} {ns}/{result.name} to match the spec "
                                        f"(changed: {result.detail})")
        elif result.action == "conflict":
            record("Warning", "ChildConflict", result.detail)
    if wanted.hpa is None:
        try:
            if delete_owned(client, kube.HPA, ns, name, uid):
                record("Normal", "Deleted", f"deleted HorizontalPodAutoscaler {ns}/{name} "
                                            "(autoscaling is off or not in hpa mode)")
        except kube.ApiError as e:
            outcome.errors.append(f"HorizontalPodAutoscaler {ns}/{name}: {e}")

    conflicts = [r.detail for r in outcome.results if r.action == "conflict"]
    foreign = {(r.kind, r.name) for r in outcome.results if r.action == "conflict"}

    def owned(kind: str, child: str) -> dict[str, Any] | None:
        return None if (kind, child) in foreign else live.get((kind, child))

    observed = Observed(
        generation=generation,
        deployment=owned("Deployment", name),
        router=owned("Deployment", router_name(name)) if wanted.router is not None else None,
        hpa=live.get(("HorizontalPodAutoscaler", name)),
        problems=conflicts + outcome.errors,
        problem_reason="ChildConflict" if conflicts else "ReconcileFailed",
    )

    def current(prev: Mapping[str, Any]) -> dict[str, Any]:
        return compute_status(spec=spec, observed=observed, previous=prev, selector=selector,
                              endpoint=endpoint(owner, spec), now=now)

    outcome.status = current(previous)
    if status_changed(previous, outcome.status):
        write_status(client, body, current)
    return outcome

"""Observed state -> InferenceDeployment status (pure).

Two writers share `.status`, each owning its own fields:

- reconcile (`compute_status`): replicas, readyReplicas, selector, endpoint, observedGeneration, router
  and the Ready, RouterReady, Progressing and Degraded conditions; and, unless the operator's autoscaler runs (mode
  operator), desiredReplicas, metrics, lastScaleTime and ScalingActive (from spec.replicas or the HPA);
- the autoscaler in mode operator (`autoscaler_status`): desiredReplicas, metrics, lastScaleTime and
  ScalingActive.

Each returns a merge patch of only its own fields. The conditions list is replaced whole by a merge
patch, so each writer rebuilds it from the object's latest version, keeping the other's entries,
and writes it with a resourceVersion precondition (kube.patch_status: on a conflict it reads again
and recomputes). Conditions keep their lastTransitionTime while their status stays the same, so
writing an unchanged status is a no-op the caller can skip.

With spec.router.enabled users call the router's Service, so Ready needs both the workers and the router
(RouterReady: its Deployment has every requested replica available) and its message says which is missing;
Progressing covers the router's rollout too, and Degraded a stuck one.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from hetero_infer.operator import constants as c
from hetero_infer.operator.autoscale.decision import SIGNALS, Decision
from hetero_infer.operator.diff import parse_quantity
from hetero_infer.operator.manifests.worker import downloads_per_pod
from hetero_infer.operator.model_state import FAILED, ModelState
from hetero_infer.operator.spec import InferenceSpec


@dataclass(frozen=True)
class Observed:
    """What reconciliation saw and did, as input to the status."""

    generation: int | None
    deployment: Mapping[str, Any] | None = None
    router: Mapping[str, Any] | None = None  # the router Deployment (read only with spec.router.enabled)
    hpa: Mapping[str, Any] | None = None
    problems: list[str] = field(default_factory=list)  # reconcile-level problems (conflicts, API errors)
    problem_reason: str = "ReconcileFailed"
    # the download of spec.model.url: the Job's with spec.model.cache, else the worker pods' init containers
    model: ModelState | None = None
    # spec.adapters: each adapter's name and where it stands (its download Job's state); None: not read this pass
    adapters: tuple[tuple[str, ModelState], ...] | None = None
    # per adapter, the ready worker pods that serve it (served_adapters.py); None: not read this pass
    adapters_loaded: Mapping[str, int] | None = None
    # while replicas are missing: the last words of a worker that exited with an error (worker_pods.worker_failure)
    worker_failure: str | None = None


def _cond(ctype: str, status: str, reason: str, message: str) -> dict[str, Any]:
    return {"type": ctype, "status": status, "reason": reason, "message": message}


def merge_conditions(previous: list[Mapping[str, Any]] | None, new: list[dict[str, Any]], now: str,
                     generation: int | None, drop: Collection[str] = ()) -> list[dict[str, Any]]:
    """New conditions in CONDITION_TYPES order, keeping lastTransitionTime when the status is unchanged;
    the previous ones of the types in `drop` are removed."""
    before = {p.get("type"): p for p in previous or []}
    merged = {p.get("type"): dict(p) for p in previous or [] if p.get("type") not in drop}
    for cond in new:
        old = before.get(cond["type"])
        keep_time = old is not None and old.get("status") == cond["status"] and old.get("lastTransitionTime")
        cond = dict(cond, lastTransitionTime=old["lastTransitionTime"] if keep_time else now)
        if generation is not None:
            cond["observedGeneration"] = generation
        merged[cond["type"]] = cond
    ordered = [merged[t] for t in c.CONDITION_TYPES if t in merged]
    return ordered + [v for k, v in merged.items() if k not in c.CONDITION_TYPES]


def _deployment_conditions(spec: InferenceSpec, dep: Mapping[str, Any] | None) -> tuple[dict, dict, dict | None]:
    desired = spec.replicas
    if dep is None:
        return (_cond(c.COND_READY, "False", "DeploymentMissing", "the worker Deployment does not exist yet"),
                _cond(c.COND_PROGRESSING, "True", "Creating", "creating the worker Deployment"), None)
    ready = int((dep.get("status") or {}).get("readyReplicas") or 0)
    stuck = _rollout_stuck(dep)

    if desired == 0:
        ready_c = _cond(c.COND_READY, "True", "ScaledToZero", "no replicas requested")
    elif ready >= desired:
        ready_c = _cond(c.COND_READY, "True", "AllReplicasReady", f"{ready}/{desired} replicas ready")
    elif ready > 0:
        ready_c = _cond(c.COND_READY, "False", "PartiallyReady", f"{ready}/{desired} replicas ready (serving)")
    else:
        ready_c = _cond(c.COND_READY, "False", "NoReplicasReady", f"0/{desired} replicas ready")

    degraded = None
    rolling = _rollout(dep, desired)
    if stuck is not None:
        prog_c = _cond(c.COND_PROGRESSING, "False", "ProgressDeadlineExceeded", stuck)
        degraded = _cond(c.COND_DEGRADED, "True", "RolloutStuck", stuck)
    elif rolling is None:
        prog_c = _cond(c.COND_PROGRESSING, "False", "RolloutComplete", f"{desired} replicas up to date")
    else:
        prog_c = _cond(c.COND_PROGRESSING, "True", "RollingOut", rolling)
    return ready_c, prog_c, degraded


def _rollout(dep: Mapping[str, Any], desired: int) -> str | None:
    """None once the Deployment runs `desired` up-to-date, available replicas and nothing else; else how far it got."""
    st = dep.get("status") or {}
    updated = int(st.get("updatedReplicas") or 0)
    total = int(st.get("replicas") or 0)
    available = int(st.get("availableReplicas") or 0)
    generation = (dep.get("metadata") or {}).get("generation")
    seen = st.get("observedGeneration")
    caught_up = generation is None or (seen is not None and seen >= generation)
    if caught_up and updated >= desired and total == desired and available >= desired:
        return None
    return f"{updated}/{desired} replicas updated, {available} available, {total} total"


def _rollout_stuck(dep: Mapping[str, Any]) -> str | None:
    """The Deployment controller's message when the rollout exceeded its progress deadline, else None."""
    for cond in (dep.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Progressing" and cond.get("reason") == "ProgressDeadlineExceeded":
            return str(cond.get("message") or "the rollout exceeded its progress deadline")
    return None


def router_status(spec: InferenceSpec, dep: Mapping[str, Any] | None) -> dict[str, Any]:
    """`.status.router`: the router Deployment's replica counts and the policy it routes with."""
    st = (dep or {}).get("status") or {}
    counts = {k: int(st.get(k) or 0) for k in ("replicas", "readyReplicas", "updatedReplicas", "availableReplicas")}
    return {**counts, "policy": spec.router.policy}


def _router_condition(spec: InferenceSpec, dep: Mapping[str, Any] | None) -> dict[str, Any]:
    """RouterReady: True once every requested router replica is available (the Service users call has them)."""
    if dep is None:
        return _cond(c.COND_ROUTER_READY, "False", "DeploymentMissing", "the router Deployment does not exist yet")
    desired = spec.router.replicas
    available = int((dep.get("status") or {}).get("availableReplicas") or 0)
    counted = f"{available}/{desired} router replicas available"
    if available >= desired:
        return _cond(c.COND_ROUTER_READY, "True", "RouterAvailable", counted)
    if available > 0:
        return _cond(c.COND_ROUTER_READY, "False", "RouterPartiallyAvailable", f"{counted} (serving)")
    return _cond(c.COND_ROUTER_READY, "False", "RouterUnavailable", counted)


def _ready_with_router(workers: dict[str, Any], router: dict[str, Any]) -> dict[str, Any]:
    """Ready when users call the router: the workers' verdict, unless the router is what is missing."""
    if router["status"] == "True":
        return dict(workers, message=f"workers: {workers['message']}; {router['message']}")
    if workers["status"] == "True":
        return _cond(c.COND_READY, "False", "RouterNotReady",
                     f"the router is not available: {router['message']} (workers: {workers['message']})")
    return dict(workers, message=f"workers: {workers['message']}; router not available either: {router['message']}")


def _progressing_with_router(workers: dict[str, Any], router: str | None) -> dict[str, Any]:
    """Progressing also while the router rolls out (`router`: how far, from _rollout; None when done)."""
    if router is None or workers["reason"] == "ProgressDeadlineExceeded":
        return workers
    if workers["status"] == "True":
        return dict(workers, message=f"{workers['message']}; router: {router}")
    return _cond(c.COND_PROGRESSING, "True", "RouterRollingOut", f"router: {router}")


def _with_router(spec: InferenceSpec, dep: Mapping[str, Any] | None, ready_c: dict[str, Any],
                 prog_c: dict[str, Any], degraded: dict[str, Any] | None) -> tuple[dict, dict, dict, dict | None]:
    """RouterReady, and the workers' Ready, Progressing and Degraded with the router's part added."""
    router_c = _router_condition(spec, dep)
    ready_c = _ready_with_router(ready_c, router_c)
    if dep is None:
        prog_c = _progressing_with_router(prog_c, "creating the router Deployment")
    elif (stuck := _rollout_stuck(dep)) is not None:
        degraded = degraded or _cond(c.COND_DEGRADED, "True", "RouterRolloutStuck", stuck)
    else:
        prog_c = _progressing_with_router(prog_c, _rollout(dep, spec.router.replicas))
    return router_c, ready_c, prog_c, degraded


def _model_condition(state: ModelState) -> dict[str, Any]:
    return _cond(c.COND_MODEL_READY, "True" if state.ready else "False", state.reason, state.message)


def _with_model(spec: InferenceSpec, observed: Observed, ready_c: dict[str, Any], prog_c: dict[str, Any],
                degraded: dict[str, Any] | None) -> tuple[dict, dict, dict, dict | None]:
    """ModelReady (spec.model.cache), and Ready, Progressing and Degraded while the model is not in the cache: with
    no worker Deployment yet, Ready says why (ModelPending, ModelDownloading, ModelFailed); with workers serving
    an earlier revision, Progressing says the new one downloads, and a failed download is Degraded."""
    state = observed.model
    assert state is not None
    model_c = _model_condition(state)
    if state.ready:
        return model_c, ready_c, prog_c, degraded
    first = observed.deployment is None
    if first:
        ready_c = _cond(c.COND_READY, "False", f"Model{state.phase}", state.message)
    if state.phase == FAILED:
        if first:
            prog_c = _cond(c.COND_PROGRESSING, "False", "ModelFailed", "the model download failed (ModelReady)")
        degraded = _cond(c.COND_DEGRADED, "True", "ModelFailed", state.message +
                         ("" if first else "; the workers keep serving the previous revision"))
    else:
        prog_c = _cond(c.COND_PROGRESSING, "True", "DownloadingModel", state.message + (
            "" if first else "; the workers keep serving the previous revision until it is in the cache"))
    return model_c, ready_c, prog_c, degraded


def _scaling_condition(spec: InferenceSpec, hpa: Mapping[str, Any] | None) -> dict[str, Any]:
    """ScalingActive when reconcile owns it (autoscaling off, or mode hpa)."""
    a = spec.autoscaling
    if not a.enabled:
        return _cond(c.COND_SCALING_ACTIVE, "False", "AutoscalingDisabled",
                     "replicas follow spec.replicas (autoscaling.enabled is false)")
    if hpa is None:
        return _cond(c.COND_SCALING_ACTIVE, "Unknown", "HPAMissing", "the HorizontalPodAutoscaler does not exist yet")
    for cond in (hpa.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "ScalingActive":
            return _cond(c.COND_SCALING_ACTIVE, str(cond.get("status", "Unknown")),
                         f"HPA{cond.get('reason') or 'Unknown'}", str(cond.get("message") or ""))
    return _cond(c.COND_SCALING_ACTIVE, "Unknown", "HPAPending", "waiting for the HorizontalPodAutoscaler's first sync")


def hpa_metrics(hpa: Mapping[str, Any] | None) -> dict[str, float]:
    """The per-pod averages the HPA last observed: kvCacheUsage and queueDepth."""
    names = {c.METRIC_KV_CACHE_USAGE: "kvCacheUsage", c.METRIC_REQUESTS_WAITING: "queueDepth"}
    out: dict[str, float] = {}
    for item in ((hpa or {}).get("status") or {}).get("currentMetrics") or []:
        pods = item.get("pods") or {}
        key = names.get((pods.get("metric") or {}).get("name"))
        value = parse_quantity((pods.get("current") or {}).get("averageValue"))
        if key and value is not None:
            out[key] = round(float(value), 4)
    return out


def compute_status(*, spec: InferenceSpec, observed: Observed, previous: Mapping[str, Any] | None,
                   selector: str, endpoint: str, now: str) -> dict[str, Any]:
    """The fields reconcile owns (module docstring), as a merge patch over `previous`."""
    previous = previous or {}
    dep_status = (observed.deployment or {}).get("status") or {}
    ready_c, prog_c, degraded = _deployment_conditions(spec, observed.deployment)
    if observed.worker_failure and ready_c["reason"] in ("NoReplicasReady", "PartiallyReady"):
        ready_c = dict(ready_c, message=f"{ready_c['message']}; {observed.worker_failure}")
    model_c = router_c = None
    if spec.model.cache is not None and observed.model is not None:
        model_c, ready_c, prog_c, degraded = _with_model(spec, observed, ready_c, prog_c, degraded)
    elif observed.model is not None:  # each pod downloads: the workers' own conditions say the rest
        model_c = _model_condition(observed.model)
    if spec.router.enabled:
        router_c, ready_c, prog_c, degraded = _with_router(spec, observed.router, ready_c, prog_c, degraded)
    if observed.problems:
        degraded = _cond(c.COND_DEGRADED, "True", observed.problem_reason, "; ".join(observed.problems))
    if degraded is None:
        degraded = _cond(c.COND_DEGRADED, "False", "AsExpected", "all children match the spec")
    conditions = [cond for cond in (model_c, router_c, ready_c, prog_c, degraded) if cond is not None]
    if not spec.autoscaling.by_operator:
        conditions.append(_scaling_condition(spec, observed.hpa))
    downloads = spec.model.cache is not None or downloads_per_pod(spec)
    drop = (() if spec.router.enabled else (c.COND_ROUTER_READY,)) + (() if downloads else (c.COND_MODEL_READY,))

    status: dict[str, Any] = {
        "replicas": int(dep_status.get("replicas") or 0),
        "readyReplicas": int(dep_status.get("readyReplicas") or 0),
        "selector": selector,
        "endpoint": endpoint,
        "conditions": merge_conditions(previous.get("conditions"), conditions, now, observed.generation, drop),
    }
    if spec.router.enabled:
        status["router"] = router_status(spec, observed.router)
    elif previous.get("router") is not None:
        status["router"] = None  # the router was turned off: remove its numbers
    if model_c is not None and observed.model is not None:
        status["model"] = {"url": observed.model.source or spec.model.url, "phase": observed.model.phase}
    elif not downloads and previous.get("model") is not None:
        status["model"] = None  # the model is no longer downloaded (a path, a claim)
    if spec.adapters is not None and observed.adapters is not None:
        loaded = observed.adapters_loaded or {}
        status["adapters"] = [adapter_status(name, state, loaded.get(name)) for name, state in observed.adapters]
    elif spec.adapters is None and previous.get("adapters") is not None:
        status["adapters"] = None  # no adapters any more
    if observed.generation is not None:
        status["observedGeneration"] = observed.generation
    if spec.autoscaling.by_operator:
        return status  # the autoscaler writes the rest (autoscaler_status)

    status["desiredReplicas"] = spec.replicas
    if spec.autoscaling.hpa:
        metrics = hpa_metrics(observed.hpa)
        old = previous.get("metrics") or {}
        if metrics:
            same = all(old.get(k) == v for k, v in metrics.items())
            status["metrics"] = dict(metrics, time=old.get("time") if same and old.get("time") else now)
        elif old:
            status["metrics"] = dict(old)
        last = ((observed.hpa or {}).get("status") or {}).get("lastScaleTime") or previous.get("lastScaleTime")
    else:
        if previous.get("metrics"):
            status["metrics"] = None  # stale numbers from an earlier autoscaler: remove them
        old_desired = previous.get("desiredReplicas")
        changed = old_desired is not None and old_desired != spec.replicas
        last = now if changed else previous.get("lastScaleTime")
    if last:
        status["lastScaleTime"] = last
    return status


def invalid_spec_status(*, previous: Mapping[str, Any] | None, generation: int | None, problems: list[str],
                        selector: str, now: str) -> dict[str, Any]:
    """The spec cannot be honoured: children stay as they are, Degraded says why."""
    previous = previous or {}
    conditions = [
        _cond(c.COND_DEGRADED, "True", "InvalidSpec", "; ".join(problems)),
        _cond(c.COND_PROGRESSING, "False", "InvalidSpec", "the spec cannot be rolled out; fix it to continue"),
    ]
    status: dict[str, Any] = {
        "selector": selector,
        "conditions": merge_conditions(previous.get("conditions"), conditions, now, generation),
    }
    if generation is not None:
        status["observedGeneration"] = generation
    return status


def adapter_status(name: str, state: ModelState, loaded: int | None = None) -> dict[str, Any]:
    """One entry of status.adapters: Pending, Downloading, Ready or Failed, with the reason and message, and
    `loadedReplicas`, the ready workers that serve it (when they were read)."""
    entry = {"name": name, "url": state.source, "phase": state.phase, "reason": state.reason, "message": state.message}
    if loaded is not None:
        entry["loadedReplicas"] = loaded
    return entry


def status_changed(previous: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    previous = previous or {}
    return any(previous.get(k) != v for k, v in new.items())


def autoscaler_status(*, previous: Mapping[str, Any] | None, decision: Decision, generation: int | None,
                      now: str) -> dict[str, Any]:
    """The fields the autoscaler owns (mode operator; module docstring), as a merge patch over `previous`.

    metrics: the per-pod averages it scaled on (kept, with their time, when no pod answered; the
    time moves only when a value changes, so an idle deployment causes no writes); desiredReplicas;
    lastScaleTime when the size changes; and the ScalingActive condition with the decision's reason
    (False when there were no metrics to decide on).
    """
    previous = previous or {}
    old = previous.get("metrics") or {}
    values = {}
    for name in SIGNALS:
        average = decision.signal(name).average
        if average is not None:
            values[name] = round(float(average), 4)
    status: dict[str, Any] = {"desiredReplicas": decision.desired}
    if values:
        same = all(old.get(k) == v for k, v in values.items()) and bool(old.get("time"))
        status["metrics"] = dict(values, time=old["time"] if same else now)
    cond = _cond(c.COND_SCALING_ACTIVE, "True" if decision.active else "False", decision.reason, decision.message)
    status["conditions"] = merge_conditions(previous.get("conditions"), [cond], now, generation)
    if decision.desired != decision.current:
        status["lastScaleTime"] = now
    return status

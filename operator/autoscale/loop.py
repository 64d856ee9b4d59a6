"""Autoscaling in mode `operator`: the I/O around `decision.decide`.

`Autoscaler.step` is one pass over a list of endpoints: scrape every ready worker, decide, keep the
history. The autoscaler worker (handlers.py, loops.py) feeds it the pods the API lists for the
InferenceDeployment and writes the outcome back (`autoscale_once`); the closed-loop test (tests/autoscale) feeds it its
own worker processes. Both run the same scraping and decision code.

Writing the outcome, in this order: the status fields the autoscaler owns (metrics, desiredReplicas,
lastScaleTime, ScalingActive; status.py) under a resourceVersion precondition, so a concurrent
reconcile's conditions are never dropped (kube.patch_status); then `spec.replicas` when the size
changes (a JSON patch that first tests the value it read, so a concurrent `kubectl scale` is not
overwritten blindly). The spec change
triggers the ordinary reconcile, which carries the size to the Deployment; the operator never
touches the Deployment's replicas directly. In mode `hpa` nothing here runs.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import aiohttp

from hetero_infer.operator import constants as c
from hetero_infer.operator import kube
from hetero_infer.operator.autoscale import metrics as opmetrics
from hetero_infer.operator.autoscale.decision import (
    Decision,
    History,
    Observation,
    Policy,
    decide,
    policy_from_spec,
)
from hetero_infer.operator.autoscale.scrape import (
    DEFAULT_TIMEOUT_SECONDS,
    Endpoint,
    ScrapeResult,
    endpoints_from_pods,
    scrape_all,
    scrape_routers,
)
from hetero_infer.operator.manifests import selector_labels
from hetero_infer.operator.spec import DEFAULT_INTERVAL_SECONDS, SpecError, parse_spec
from hetero_infer.operator.status import autoscaler_status, status_changed

POD = kube.Kind("v1", "Pod", "pods")
JSON_PATCH = "application/json-patch+json"

# record(type, reason, message): posts a Kubernetes event on the InferenceDeployment.
Recorder = Callable[[str, str, str], None]

log = logging.getLogger("hetero_infer.operator.autoscaler")


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: UP017 (py3.10)


@dataclass
class Pass:
    """What one autoscaling pass saw and decided."""

    decision: Decision
    observation: Observation
    results: list[ScrapeResult] = field(default_factory=list)

    @property
    def errors(self) -> list[tuple[str, str]]:
        """(pod, error kind) for the ready pods that did not answer."""
        return [(r.sample.name, r.error_kind) for r in self.results if r.error_kind]


class Autoscaler:
    """Scrape + decide for one InferenceDeployment, keeping the recommendation history between passes."""

    def __init__(self, scrape_timeout: float = DEFAULT_TIMEOUT_SECONDS, model_name: str | None = None) -> None:
        self.history = History()
        self.scrape_timeout = scrape_timeout
        self.model_name = model_name
        self.was_active = False
        self.failing: frozenset[str] = frozenset()

    async def step(self, policy: Policy, current_replicas: int, endpoints: list[Endpoint], now: float,
                   session: aiohttp.ClientSession | None = None, routers: list[Endpoint] | None = None) -> Pass:
        if session is None:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=32)) as own:
                return await self.step(policy, current_replicas, endpoints, now, own, routers)
        results = await scrape_all(endpoints, self.scrape_timeout, session, self.model_name)
        router = await scrape_routers(session, routers, self.scrape_timeout) if routers is not None else None
        obs = Observation(current_replicas=current_replicas, pods=tuple(r.sample for r in results), router=router)
        decision = decide(self.history, obs, policy, now)
        self.history = decision.history
        return Pass(decision, obs, results)


# -- one pass against the API ------------------------------------------------------------------------

def list_endpoints(client: Any, namespace: str, name: str, component: str = c.COMPONENT_WORKER) -> list[Endpoint]:
    """The InferenceDeployment's worker (or router) pods, by their Deployment's selector, as endpoints."""
    selector = selector_labels(name, component)
    query = {"labelSelector": ",".join(f"{k}={v}" for k, v in sorted(selector.items()))}
    payload = client.request("GET", POD.path(namespace), query=query)
    return endpoints_from_pods(payload.get("items") or [], selector)


def interval_of(body: Mapping[str, Any]) -> float:
    """spec.autoscaling.intervalSeconds, read leniently (a bad spec is reported by the reconciler)."""
    value = ((body.get("spec") or {}).get("autoscaling") or {}).get("intervalSeconds")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 1:
        return float(value)
    return float(DEFAULT_INTERVAL_SECONDS)


def replicas_patch(body: Mapping[str, Any], desired: int) -> list[dict[str, Any]]:
    """JSON patch: spec.replicas := desired, only if it still holds what this pass read."""
    spec = body.get("spec") or {}
    if "replicas" in spec:
        return [{"op": "test", "path": "/spec/replicas", "value": spec["replicas"]},
                {"op": "replace", "path": "/spec/replicas", "value": desired}]
    return [{"op": "add", "path": "/spec/replicas", "value": desired}]


def status_update(latest: Mapping[str, Any], decision: Decision, now_iso: str) -> dict[str, Any] | None:
    """The autoscaler's status fields for the object's latest version (kube.patch_status).

    None (no write) when nothing changed, or when the object moved on since the pass read it: out of
    mode operator (reconcile owns those fields now) or resized by someone else (the next pass decides
    again from the new size).
    """
    meta = latest.get("metadata") or {}
    try:
        spec = parse_spec(latest.get("spec"), name=meta.get("name") or "")
    except SpecError:
        return None
    if not spec.autoscaling.by_operator or spec.replicas != decision.current:
        return None
    previous = latest.get("status") or {}
    status = autoscaler_status(previous=previous, decision=decision, generation=meta.get("generation"), now=now_iso)
    return status if status_changed(previous, status) else None


async def autoscale_once(body: Mapping[str, Any], client: Any, autoscaler: Autoscaler, record: Recorder,
                         now: float, now_iso: str | None = None,
                         session: aiohttp.ClientSession | None = None) -> Pass | None:
    """One pass for the InferenceDeployment `body`; None when it is not autoscaled by the operator."""
    meta = body.get("metadata") or {}
    name, ns = meta["name"], meta.get("namespace") or "default"
    try:
        spec = parse_spec(body.get("spec"), name=name)
    except SpecError:
        return None  # the reconciler reports it (Degraded/InvalidSpec)
    if not spec.autoscaling.by_operator:
        return None
    policy = policy_from_spec(spec.autoscaling)
    now_iso = now_iso or utc_now()

    try:
        endpoints = await asyncio.to_thread(list_endpoints, client, ns, name)
    except Exception as e:  # ApiError, connection errors: no data this time, nothing scales down
        opmetrics.record_list_error(ns, name)
        log.warning(f"{ns}/{name}: listing worker pods failed: {e}")
        endpoints = []
    routers = None
    if spec.router.enabled:
        try:
            routers = await asyncio.to_thread(list_endpoints, client, ns, name, c.COMPONENT_ROUTER)
        except Exception as e:  # unknown router state: never scales to zero, never from zero
            opmetrics.record_list_error(ns, name)
            log.warning(f"{ns}/{name}: listing router pods failed: {e}")
            routers = []
    result = await autoscaler.step(policy, spec.replicas, endpoints, now, session, routers)
    decision = result.decision

    opmetrics.record_decision(ns, name, decision)
    obs = result.observation
    opmetrics.record_pods(ns, name, obs.ready, obs.answered, obs.without_data)
    for _, kind in result.errors:
        opmetrics.record_scrape_error(ns, name, kind)
    failing = frozenset(pod for pod, _ in result.errors)
    if failing - autoscaler.failing:
        details = ", ".join(f"{p.name}: {p.error}" for p in obs.pods if p.name in failing - autoscaler.failing)
        log.warning(f"{ns}/{name}: ready worker(s) did not answer /metrics ({details})")
    autoscaler.failing = failing

    await asyncio.to_thread(kube.patch_status, client, kube.INFERENCE_DEPLOYMENT, body,
                            lambda latest: status_update(latest, decision, now_iso))
    if decision.desired != decision.current:
        try:
            await asyncio.to_thread(client.request, "PATCH", kube.INFERENCE_DEPLOYMENT.path(ns, name),
                                    replicas_patch(body, decision.desired), JSON_PATCH)
        except kube.ApiError as e:
            if e.status not in (409, 422):
                raise
            log.info(f"{ns}/{name}: spec.replicas changed meanwhile; deciding again next pass")
            return result
        record("Normal", "ScaledUp" if decision.desired > decision.current else "ScaledDown", decision.message)
        log.info(f"{ns}/{name}: {decision.message}")
    elif not decision.active and autoscaler.was_active:
        # Metrics were there and are gone (not at start-up, when workers are still loading).
        record("Warning", decision.reason, decision.message)
    autoscaler.was_active = decision.active
    return result


async def run(stopped: Any, body: Mapping[str, Any], client: Any, record: Recorder,
              scrape_timeout: float = DEFAULT_TIMEOUT_SECONDS, clock: Callable[[], float] | None = None,
              active: Callable[[], Awaitable[bool]] | None = None) -> None:
    """The worker's body (loops.py): a pass every spec.autoscaling.intervalSeconds until `stopped` is set.

    `body` is the live view of the object (updated as events arrive), so interval and policy
    changes apply from the next pass. A failing pass is logged and the loop goes on. `active` says
    whether this operator replica is the one that works (peering); a standing-by one skips passes.
    """
    meta = body.get("metadata") or {}
    ns, name = meta.get("namespace") or "default", meta.get("name") or ""
    loop = asyncio.get_running_loop()
    clock = clock or loop.time
    autoscaler = Autoscaler(scrape_timeout)
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=32)) as session:
            while not stopped:
                started = clock()
                snapshot = copy.deepcopy(dict(body))
                try:
                    if active is None or await active():
                        await autoscale_once(snapshot, client, autoscaler, record, started, session=session)
                except asyncio.CancelledError:
                    raise
                except Exception as e:
                    log.exception(f"{ns}/{name}: autoscaling pass failed: {e}")
                await stopped.wait(max(0.05, interval_of(body) - (clock() - started)))
    finally:
        opmetrics.forget(ns, name)

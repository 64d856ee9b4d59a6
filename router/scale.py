"""Scale from zero when the request arrives (`--scale-target NAME`).

A request that the router holds while no worker is ready asks at once for one replica of the model's
InferenceDeployment, through its scale subresource, instead of waiting for the operator's next autoscaling pass
(intervalSeconds) to read the router's held-requests gauge:

    GET   /apis/hetero-infer.io/v1alpha1/namespaces/NS/inferencedeployments/NAME/scale
    PATCH (merge) {"metadata": {"resourceVersion": <read>}, "spec": {"replicas": 1}}   only if it read 0

Only 0 -> 1: a Scale with replicas already (a worker starting, or all of them down) is left alone, so the router
never lowers a size nor competes with the autoscaler above one; the resourceVersion makes the write conditional
on the size it read (409 Conflict when the operator or a user changed it meanwhile: read again). The operator
then reconciles the spec change into the worker Deployment, and its autoscaler counts the new replica's first
pass as activity (operator/autoscale/decision.py), so it does not scale straight back to zero.

Once per hold episode (from the first held request to the moment none is held): requests held meanwhile do not
ask again. Errors (the API server unreachable, 403 without the Role, 5xx) are retried with a doubling back-off
while requests are still held. All of it runs in a background task: a held request only waits, as before, for a
worker to become ready. RBAC: get and patch on `inferencedeployments/scale` for that one resourceName
(operator/manifests/rbac.py). Credentials: kube_api.py, as for EndpointSlice discovery.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

import aiohttp

from hetero_infer.contracts import kube as c
from hetero_infer.router.kube_api import ApiAccess, api_access, in_cluster_namespace

logger = logging.getLogger("hetero_infer.router.scale")

MERGE_PATCH = "application/merge-patch+json"
REQUEST_TIMEOUT_S = 10.0
CONFLICT_RETRIES = 5  # 409s in a row (the object changed under us) before backing off like any error


def scale_path(namespace: str, name: str) -> str:
    return (f"/apis/{c.GROUP}/{c.VERSION}/namespaces/{quote(namespace, safe='')}/{c.PLURAL}/"
            f"{quote(name, safe='')}/scale")


def scale_up_patch(scale: Mapping[str, Any]) -> dict[str, Any] | None:
    """The merge patch that takes this Scale from 0 to 1 replica, valid only at the version read; None when it
    has replicas already (nothing to do: the router never lowers a size, nor raises it above one)."""
    replicas = (scale.get("spec") or {}).get("replicas") or 0
    if replicas >= 1:
        return None
    version = (scale.get("metadata") or {}).get("resourceVersion")
    meta = {"resourceVersion": str(version)} if version else {}
    return {"metadata": meta, "spec": {"replicas": 1}}


class ScaleError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


class ScaleFromZero:
    """Asks for one replica while requests are held (see the module docstring). The router calls
    `held_started`/`held_ended` around each hold; `start`/`stop` bracket the app's life."""

    def __init__(self, name: str, namespace: str | None = None, access: ApiAccess | None = None,
                 backoff_s: float = 0.5, max_backoff_s: float = 30.0,
                 on_result: Callable[[str], None] | None = None) -> None:
        self.name = name
        self.namespace = namespace or in_cluster_namespace() or "default"
        self.access = access
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.on_result = on_result  # "scaled", "already" or "error" per attempt (the router's counter)
        self.path = scale_path(self.namespace, name)
        self.holding = 0
        self.episode = 0  # bumped when holding goes 0 -> 1
        self.satisfied = -1  # the episode in which a Scale was seen (or made) with replicas
        self.episode_start = 0.0  # time.monotonic() of its first held request
        self.task: asyncio.Task[None] | None = None
        self.session: aiohttp.ClientSession | None = None
        self._warned: set[int] = set()

    # -- the router's hooks -----------------------------------------------------------------------
    def held_started(self) -> None:
        """A request waits for a worker and none is ready."""
        self.holding += 1
        if self.holding == 1:
            self.episode += 1
            self.episode_start = time.monotonic()
        if self.satisfied != self.episode and (self.task is None or self.task.done()) and self.session is not None:
            self.task = asyncio.create_task(self._run())

    def held_ended(self) -> None:
        self.holding -= 1

    @property
    def wanted(self) -> bool:
        return self.holding > 0 and self.satisfied != self.episode

    # -- life cycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        if self.access is None:
            self.access = api_access()
        self.session = aiohttp.ClientSession()
        logger.info("scale from zero: a held request asks for 1 replica of %s/%s", self.namespace, self.name)

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        if self.session is not None:
            await self.session.close()

    # -- asking -----------------------------------------------------------------------------------
    async def _run(self) -> None:
        delay = self.backoff_s
        while self.wanted:
            try:
                result = await self.scale_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # unreachable, refused, timed out: again later while requests are held
                self._report("error")
                self._warn(exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.max_backoff_s)
                continue
            self._report(result)
            if self.holding > 0:
                self.satisfied = self.episode
            if result == "scaled":
                logger.info("scale from zero: %s/%s 0 -> 1 replica (%.0f ms after the request was held)",
                            self.namespace, self.name, (time.monotonic() - self.episode_start) * 1000)
            return

    async def scale_once(self) -> str:
        """One read (and write, at 0): "scaled" when this call took it to 1, "already" when it had replicas."""
        for _ in range(CONFLICT_RETRIES):
            scale = await self._request("GET")
            patch = scale_up_patch(scale)
            if patch is None:
                return "already"
            try:
                await self._request("PATCH", patch)
            except ScaleError as exc:
                if exc.status == 409:  # changed since the read: read again
                    continue
                raise
            return "scaled"
        raise ScaleError(409, f"the scale of {self.namespace}/{self.name} kept changing")

    async def _request(self, method: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        assert self.session is not None and self.access is not None
        headers = self.access.headers()
        if body is not None:
            headers["Content-Type"] = MERGE_PATCH
        async with self.session.request(method, self.access.host + self.path, json=body, headers=headers,
                                        ssl=self.access.ssl,
                                        timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)) as r:
            if r.status != 200:
                raise ScaleError(r.status, (await r.text())[:200])
            return await r.json(content_type=None)

    def _report(self, result: str) -> None:
        if self.on_result is not None:
            self.on_result(result)

    def _warn(self, exc: Exception, delay: float) -> None:
        status = exc.status if isinstance(exc, ScaleError) else 0
        hint = {403: " (the router's Role needs get and patch on inferencedeployments/scale for this name)",
                404: " (no such InferenceDeployment: check --scale-target and --namespace)"}.get(status, "")
        level = logging.WARNING if status not in self._warned else logging.DEBUG
        self._warned.add(status)
        logger.log(level, "scale from zero: asking %s/%s for a replica failed (%s: %s)%s; again in %gs",
                   self.namespace, self.name, exc.__class__.__name__, exc, hint, delay)

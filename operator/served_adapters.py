"""Where spec.adapters' adapters are actually served: per adapter, how many ready worker pods serve it
(status.adapters[].loadedReplicas).

Each worker's /metrics has one `hetero_infer_lora_adapter_served{lora_name=...}` series per adapter it serves (what
its GET /v1/models lists: loaded from the ConfigMap it follows, or at run time). The operator reads /metrics, as
its autoscaler does, rather than /v1/models, which needs the API key when the workers have one. The pods are read in
the reconcile pass, all at once, each within a short timeout; a pod that does not answer serves nothing as far as
the status knows (the count is of pods known to serve the adapter). The parsing and counting are pure.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import aiohttp

from hetero_infer.contracts.metric_names import LORA_ADAPTER_SERVED
from hetero_infer.operator.autoscale.scrape import (
    DEFAULT_TIMEOUT_SECONDS,
    Endpoint,
    ScrapeError,
    endpoints_from_pods,
    get_metrics_text,
)


def served_adapters(text: str) -> frozenset[str]:
    """The adapters a worker's Prometheus text says it serves. Only that family's lines are read (a worker's /metrics
    is long); a malformed line is skipped."""
    from prometheus_client.parser import text_string_to_metric_families

    names = set()
    for line in text.splitlines():
        if not line.startswith(LORA_ADAPTER_SERVED + "{"):
            continue
        try:
            for family in text_string_to_metric_families(line + "\n"):
                names.update(s.labels["lora_name"] for s in family.samples if s.value == 1 and s.labels.get("lora_name"))
        except (ValueError, TypeError, IndexError):
            continue
    return frozenset(names)


def loaded_replicas(adapters: Iterable[str], served: Iterable[frozenset[str] | None]) -> dict[str, int]:
    """adapter -> how many of the pods (`served`: each one's adapters, None for one that did not answer) serve it."""
    per_pod = [s for s in served if s is not None]
    return {name: sum(name in s for s in per_pod) for name in adapters}


async def _scrape(endpoints: Sequence[Endpoint], timeout: float) -> list[frozenset[str] | None]:
    async def one(session: aiohttp.ClientSession, endpoint: Endpoint) -> frozenset[str] | None:
        try:
            return served_adapters(await get_metrics_text(session, endpoint.url, timeout))
        except ScrapeError:
            return None

    async with aiohttp.ClientSession() as session:
        return list(await asyncio.gather(*(one(session, e) for e in endpoints)))


def scrape_served(pods: Iterable[Mapping[str, Any]], selector: Mapping[str, str],
                  timeout: float = DEFAULT_TIMEOUT_SECONDS) -> list[frozenset[str] | None]:
    """The served adapters of each ready worker pod among `pods` (those `selector` picks; None where one did not
    answer), all at once: about `timeout` at most. Synchronous (the reconcile pass runs in a thread); called in a
    thread that runs an event loop, it asks from a thread of its own."""
    ready = [e for e in endpoints_from_pods(pods, selector) if e.ready and e.url]
    if not ready:
        return []
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_scrape(ready, timeout))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, _scrape(ready, timeout)).result()

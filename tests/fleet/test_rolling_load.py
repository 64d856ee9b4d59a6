"""No request fails and no stream is cut while workers roll, scale down and the routers roll (#27 item 1).

Real processes (mock workers whose streams last seconds, routers discovering them through EndpointSlices in the
KMock API emulator, a kube-proxy-like Service in front of the routers), each pod stopped as the kubelet stops it:
endpoint removed, preStop, SIGTERM, SIGKILL at the end of the grace period (see fleet.py). The timings are the
operator's scaled down: worker preStop 10 s / drain 45 s / grace 60 s, router preStop 5 s / grace = preStop + hold
time-out + 10 s (operator/manifests/worker.py, router.py).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cli_process import CliProcess
from fleet import (
    Endpoints,
    Load,
    Service,
    Stopped,
    a_request_starts,
    reference_texts,
    running_requests,
    start_all,
    start_router,
    start_worker,
    stop_pod,
)

OPERATOR_TESTS = Path(__file__).resolve().parents[1] / "operator"
if str(OPERATOR_TESTS) not in sys.path:
    sys.path.insert(0, str(OPERATOR_TESTS))

from borrowed_fixtures import operator_fixtures  # noqa: E402

_operator_fixtures = operator_fixtures()
crd = _operator_fixtures.crd
kmock_options = _operator_fixtures.kmock_options
kubeconfig = _operator_fixtures.kubeconfig

STEP_S = 0.05  # mock seconds per decode step: a stream of MAX_TOKENS lasts MAX_TOKENS * STEP_S
WORKER_PRESTOP_S, WORKER_DRAIN_S = 0.3, 15.0
WORKER_GRACE_S = WORKER_PRESTOP_S + WORKER_DRAIN_S + 5
ROUTER_PRESTOP_S, HOLD_TIMEOUT_S = 0.5, 15.0
ROUTER_GRACE_S = ROUTER_PRESTOP_S + HOLD_TIMEOUT_S + 10
PROMPTS = [f"{i} is where the story begins" for i in range(16)]  # distinct first blocks: spread over workers


class Fleet:
    def __init__(self, kmock: Any) -> None:
        self.endpoints = Endpoints(kmock)
        self.service = Service()
        self.procs: list[CliProcess] = []
        self.stopped: list[Stopped] = []
        self.events: list[tuple[float, str]] = []  # (time.monotonic(), what happened): failures are told by phase

    def event(self, what: str) -> None:
        self.events.append((time.monotonic(), what))

    async def start(self, workers: int, routers: int) -> tuple[list[CliProcess], list[CliProcess]]:
        procs = await start_all([lambda: start_worker(STEP_S, WORKER_DRAIN_S)] * workers
                                + [lambda: start_router(HOLD_TIMEOUT_S)] * routers)
        self.procs += procs
        return procs[:workers], procs[workers:]

    async def stop_worker(self, worker: CliProcess, name: str) -> None:
        async def serving() -> None:  # the point of the test: its streams are still running at SIGTERM
            assert await running_requests(worker) > 0, f"{name} has no request running at SIGTERM"

        await a_request_starts(worker)  # the pod is deleted while it serves
        self.event(f"{name}: deleted")
        self.stopped.append(await stop_pod(worker, name, lambda: self.endpoints.terminating(worker),
                                           WORKER_PRESTOP_S, WORKER_GRACE_S, serving))

    async def stop_router(self, router: CliProcess, name: str) -> None:
        self.event(f"{name}: deleted")
        self.stopped.append(await stop_pod(router, name, lambda: self.service.remove(router),
                                           ROUTER_PRESTOP_S, ROUTER_GRACE_S))

    def _phase(self, when: float) -> str:
        before = [f"{what} {when - t:.1f} s before" for t, what in self.events if t <= when]
        return before[-1] if before else "the start"

    def check(self, load: Load, min_requests: int) -> None:
        problems = [f"{p} (after {self._phase(started)})" for started, p in load.problems()]
        assert not problems, f"{len(problems)} of {len(load.outcomes)} requests failed:\n" + "\n".join(problems[:20])
        assert len(load.outcomes) >= min_requests, len(load.outcomes)
        streams = sum(o.kind == "stream" for o in load.outcomes)
        print(f"{len(load.outcomes)} requests ({streams} streamed), none failed; stopped: "
              + ", ".join(f"{s.name} in {s.seconds:.1f} s" for s in self.stopped))  # shown with -s
        for s in self.stopped:
            assert not s.killed, f"{s.name} outlived its grace period ({s.seconds:.1f} s after SIGTERM):\n{s.log_tail}"
            assert s.exit_code == 0, f"{s.name} exited with {s.exit_code}:\n{s.log_tail}"


@pytest.fixture
async def fleet(kmock: Any, kubeconfig: Path) -> AsyncIterator[Fleet]:
    f = Fleet(kmock)
    await f.service.start()
    try:
        yield f
    finally:
        await f.service.stop()
        await asyncio.gather(*(asyncio.to_thread(p.stop) for p in f.procs))


async def routers_see(routers: list[CliProcess], ready: int) -> None:
    """Wait until every router has `ready` workers in its pool (before the load starts only: a rollout does not
    wait for the routers, the kubelet does not know them)."""
    async with aiohttp.ClientSession() as session:
        for _ in range(300):
            counts = []
            for r in routers:
                async with session.get(r.url + "/readyz") as rsp:
                    counts.append((await rsp.json())["workers_ready"])
            if all(c == ready for c in counts):
                return
            await asyncio.sleep(0.1)
    raise AssertionError(f"routers see {counts} ready workers, not {ready}")


@pytest.mark.slow  # three server processes, about a minute of wall time; the default suite keeps the drains it rests on (test_router_keepalive_drain, tests/server/test_shutdown)
async def test_a_worker_rollout_under_load_cuts_no_stream(fleet: Fleet) -> None:
    """The default suite's variant: one worker replaced by a new one (maxSurge 1) under 6 users of 2 s streams."""
    (old, new), (router,) = await fleet.start(workers=2, routers=1)
    fleet.service.add(router)
    await fleet.endpoints.add(old)
    await routers_see([router], 1)
    load = Load(fleet.service.url, users=6, max_tokens=40, reference=await reference_texts(old, PROMPTS, 40))
    load.start()
    await asyncio.sleep(1.0)
    await fleet.endpoints.add(new)  # the new pod is Ready: the rollout goes on at once
    await fleet.stop_worker(old, "old worker")
    await asyncio.sleep(1.0)
    await load.stop()
    fleet.check(load, min_requests=12)


@pytest.mark.slow  # eight processes and about a minute of load
async def test_rollouts_and_a_scale_down_under_load_drop_nothing(fleet: Fleet) -> None:
    """Workers roll (2 replicas, maxSurge 1), scale up to 3 and down to 1 (two pods deleted at once), then both
    routers roll, all under one continuous load of 8 users of 3 s streams and plain requests."""
    (a, b, c, d, e), (r1, r2, r3, r4) = await fleet.start(workers=5, routers=4)
    for r in (r1, r2):
        fleet.service.add(r)
    for w in (a, b):
        await fleet.endpoints.add(w)
    await routers_see([r1, r2], 2)
    load = Load(fleet.service.url, users=8, max_tokens=60, reference=await reference_texts(a, PROMPTS, 60))
    load.start()
    await asyncio.sleep(2.0)

    # Workers roll: a new pod Ready, then an old one deleted; twice.
    await fleet.endpoints.add(c)
    await fleet.stop_worker(a, "worker a (rollout)")
    await fleet.endpoints.add(d)
    await fleet.stop_worker(b, "worker b (rollout)")
    await asyncio.sleep(1.0)

    # Scale up to 3, then down to 1: the ReplicaSet deletes two pods together.
    await fleet.endpoints.add(e)
    await asyncio.sleep(2.0)
    await asyncio.gather(fleet.stop_worker(d, "worker d (scale-down)"), fleet.stop_worker(e, "worker e (scale-down)"))
    await asyncio.sleep(1.0)

    # The routers roll: a new router Ready and in the Service, then an old one removed and stopped; twice.
    fleet.service.add(r3)
    await fleet.stop_router(r1, "router 1 (rollout)")
    fleet.service.add(r4)
    await fleet.stop_router(r2, "router 2 (rollout)")
    await asyncio.sleep(1.0)
    await load.stop()
    fleet.check(load, min_requests=60)
    assert fleet.service.connections.get(int(r4.url.rsplit(":", 1)[1]), 0) > 0  # the last router took the load

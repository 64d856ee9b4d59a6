"""Background work per InferenceDeployment, without kopf daemons, timers or finalizers.

kopf keeps a finalizer on every object that has a daemon or a timer, so that it can stop them before
the object goes; with the operator stopped (uninstalled, crashed, scaled to zero) such an object, and
the namespace it is in, can then never be deleted. The operator's periodic work needs no such
guarantee: the resync pass and the autoscaler only read the object and write it back, and both stop
as soon as the object is gone. So they run here, as plain asyncio tasks that the InferenceDeployment
watch starts and stops (`observe`), and nothing blocks a deletion.

A `Worker` is a predicate (should it run for this body?) and a coroutine (run until stopped); the
body it gets is the live one, updated in place as events arrive (as kopf does for daemons).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("hetero_infer.operator.loops")

STOP_TIMEOUT_SECONDS = 5.0


class Stopper:
    """What a worker polls: falsy while it should run; `wait` sleeps until stopped or a timeout."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def __bool__(self) -> bool:
        return self._event.is_set()

    def set(self) -> None:
        self._event.set()

    async def wait(self, timeout: float | None = None) -> bool:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout)
        return self._event.is_set()


@dataclass(frozen=True)
class Worker:
    wanted: Callable[[Mapping[str, Any]], bool]
    run: Callable[[Stopper, dict[str, Any]], Awaitable[None]]


@dataclass
class _Running:
    task: asyncio.Task[None]
    stopper: Stopper


def _uid(body: Mapping[str, Any]) -> str:
    return (body.get("metadata") or {}).get("uid") or ""


class Supervisor:
    """The live InferenceDeployments this operator saw, and the workers running for each."""

    def __init__(self, workers: Mapping[str, Worker]) -> None:
        self.workers = dict(workers)
        self.bodies: dict[str, dict[str, Any]] = {}
        self._running: dict[tuple[str, str], _Running] = {}
        self._finishing: set[asyncio.Task[None]] = set()
        self._periodic: _Running | None = None

    def start_periodic(self, interval: Callable[[], float], step: Callable[[], Awaitable[None]]) -> None:
        """Run `step` every `interval()` seconds from now on (once: later calls do nothing)."""
        if self._periodic is None:
            stopper = Stopper()
            task = asyncio.get_running_loop().create_task(periodically(stopper, interval, step), name="periodic")
            self._periodic = _Running(task, stopper)

    def observe(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """An InferenceDeployment event (None: the initial listing): start, refresh or stop its workers."""
        uid = _uid(body)
        if not uid:
            return
        gone = event_type == "DELETED" or bool((body.get("metadata") or {}).get("deletionTimestamp"))
        if gone:
            self.bodies.pop(uid, None)
            for worker_id in self.workers:
                self._stop(uid, worker_id)
            return
        live = self.bodies.setdefault(uid, {})
        live.clear()
        live.update(dict(body))
        for worker_id, worker in self.workers.items():
            key = (uid, worker_id)
            running = self._running.get(key)
            if running is not None and running.task.done():
                running = self._running.pop(key)
            if worker.wanted(live) and running is None:
                stopper = Stopper()
                task = asyncio.get_running_loop().create_task(worker.run(stopper, live),
                                                              name=f"{worker_id}:{uid}")
                self._running[key] = _Running(task, stopper)
            elif not worker.wanted(live) and running is not None:
                self._stop(uid, worker_id)

    def running(self, worker_id: str) -> list[str]:
        """The uids a worker runs for now."""
        return [uid for (uid, wid), r in self._running.items() if wid == worker_id and not r.task.done()]

    def _stop(self, uid: str, worker_id: str) -> None:
        running = self._running.pop((uid, worker_id), None)
        if running is None:
            return
        running.stopper.set()
        task = asyncio.get_running_loop().create_task(_finish(running.task))
        self._finishing.add(task)
        task.add_done_callback(self._finishing.discard)

    async def stop(self) -> None:
        """Stop every worker (at operator shutdown)."""
        for uid, worker_id in list(self._running):
            self._stop(uid, worker_id)
        if self._periodic is not None:
            self._periodic.stopper.set()
            self._periodic.task.cancel()
            self._finishing.add(self._periodic.task)
            self._periodic = None
        if self._finishing:
            await asyncio.gather(*list(self._finishing), return_exceptions=True)


async def _finish(task: asyncio.Task[None]) -> None:
    """Give a stopped worker a moment to leave its loop, then cancel it."""
    done, _ = await asyncio.wait({task}, timeout=STOP_TIMEOUT_SECONDS)
    if not done:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
    elif not task.cancelled() and task.exception() is not None:
        log.error(f"{task.get_name()} failed: {task.exception()!r}")


async def periodically(stopper: Stopper, interval: Callable[[], float],
                       step: Callable[[], Awaitable[None]]) -> None:
    """`step` every `interval()` seconds (first after one interval) until stopped; a failing step is logged."""
    while not await stopper.wait(interval()):
        try:
            await step()
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.exception(f"periodic step failed: {e}")

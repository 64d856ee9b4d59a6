"""`InprocEngineClient`: the engine on a thread of this process, driven by the busy loop.

The event loop never runs engine code: commands go into a thread-safe inbox that the busy loop drains between
steps (sleeping on an event when idle); its hand-overs come back with one `call_soon_threadsafe` for everything
pending. If the loop itself raises, the engine is broken: every open request fails with `EngineDeadError`,
`healthy` turns False (the server's /readyz goes red) and new requests are refused. Per-request failures
reported by the engine (finish_reason "error") only end the requests concerned.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from typing import Any

from hetero_infer.worker.core.busy_loop import Command, EngineOutputs, run_busy_loop
from hetero_infer.worker.frontend.client import EngineClient, EngineDeadError
from hetero_infer.worker.frontend.timing import TimingSink
from hetero_infer.worker.structured.spec import GrammarSpec

logger = logging.getLogger("hetero_infer.engine_client")


class _ThreadLink:
    """The busy loop's link on the engine thread: an inbox of commands and a hand-over to the event loop."""

    def __init__(self, client: InprocEngineClient, loop: asyncio.AbstractEventLoop) -> None:
        self.client = client
        self.loop = loop
        self.inbox: deque[Command] = deque()
        self.wake = threading.Event()
        self.stop = False
        self._lock = threading.Lock()
        self._handoff: list[EngineOutputs] = []
        self._delivery_scheduled = False

    def receive(self, block: bool) -> list[Command] | None:
        inbox = self.inbox
        if block:
            while not inbox and not self.stop:
                self.wake.wait()
                self.wake.clear()
        if self.stop:
            return None
        commands = []
        while inbox:
            commands.append(inbox.popleft())
        return commands

    def send(self, outputs: EngineOutputs) -> None:
        with self._lock:
            self._handoff.append(outputs)
            schedule = not self._delivery_scheduled
            self._delivery_scheduled = True
        if schedule:
            self.loop.call_soon_threadsafe(self.deliver)

    def deliver(self) -> None:  # event loop
        with self._lock:
            handoff = self._handoff
            self._handoff = []
            self._delivery_scheduled = False
        for outputs in handoff:
            self.client._on_outputs(outputs)


def _read_outcome(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()


class InprocEngineClient(EngineClient):
    """Runs an `LLMEngine` on its own thread and exposes it to asyncio code."""

    def __init__(self, engine: Any, *, timing_sink: TimingSink | None = None, stream_interval: float = 0.0,
                 tokenizer: Any = None) -> None:
        """tokenizer: what the event loop detokenizes with (default: the engine's)."""
        super().__init__(timing_sink=timing_sink, stream_interval=stream_interval,
                         tokenizer=tokenizer if tokenizer is not None else engine.tokenizer)
        self.engine = engine
        self._thread: threading.Thread | None = None
        self._link: _ThreadLink | None = None

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        if self._thread is not None:
            raise RuntimeError("the engine client is already started")
        self._loop = loop or asyncio.get_running_loop()
        self._stats = self.engine.stats()
        self._link = _ThreadLink(self, self._loop)
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        link = self._link
        assert link is not None
        try:
            run_busy_loop(self.engine, link, self.stream_interval)
        except BaseException as exc:  # the engine is broken: fail everything, turn unhealthy
            logger.exception("engine step failed; the engine is stopped")
            err = EngineDeadError(f"engine failure: {type(exc).__name__}: {exc}")
            try:
                link.loop.call_soon_threadsafe(self._on_dead, err)
            except RuntimeError:  # loop already closed
                pass

    def shutdown(self, timeout: float = 10.0) -> None:
        link = self._link
        if link is not None:
            link.stop = True
            link.wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._dead is None:
            self._on_dead(EngineDeadError("the engine was shut down"))

    @property
    def healthy(self) -> bool:
        return self._dead is None and self._thread is not None and self._thread.is_alive()

    def _send(self, commands: list[Command]) -> None:
        link = self._link
        if link is None or self._dead is not None:
            return
        link.inbox.extend(commands)
        link.wake.set()

    async def prepare_grammar(self, spec: GrammarSpec, deadline: float) -> None:
        if self._dead is not None:
            raise EngineDeadError(str(self._dead))
        # shielded: a waiter that gives up must not cancel the compile that other requests may share; its outcome
        # is then read by nobody (asyncio would log an ERROR for the exception of a compile that fails later)
        outcome = asyncio.wrap_future(self.engine.grammars.prepare(spec, deadline))
        outcome.add_done_callback(_read_outcome)
        await asyncio.shield(outcome)

    def _on_dead(self, error: BaseException) -> None:
        super()._on_dead(error)
        if self._link is not None:
            self._link.inbox.clear()

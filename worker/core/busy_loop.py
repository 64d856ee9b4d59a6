"""The engine's busy loop, the one place that drives an `LLMEngine` for a frontend: apply the frontend's
commands (add, abort, shutdown) between steps, step while there is work, sleep when idle, and hand out what is
new at most every `interval` seconds (always at once for requests that ended, and when the engine turns idle).

It runs on the server's engine thread (`hetero_infer.worker.frontend.inproc`) or in the engine process
(`hetero_infer.worker.frontend.process`); a `Link` is the only difference: where commands come from and where
outputs go. The deltas of the steps between two hand-overs are merged per request (`RequestDelta.merge`), so a
slow consumer gets fewer, bigger batches rather than a backlog.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from hetero_infer.contracts.lora import LoRAAdapterError, LoRARequest
from hetero_infer.contracts.sampling_params import SamplingParams
from hetero_infer.worker.core.outputs import RequestDelta
from hetero_infer.worker.core.request_check import RequestError

# Command kinds (frontend -> loop): (ADD, EngineRequest), (ABORT, [request ids]), (SHUTDOWN, None),
# (ADD_LORA, (token, LoRARequest)), (REMOVE_LORA, (token, adapter name)): a LoRA command's outcome comes back in
# the next hand-over's `lora_results`, by its token.
ADD, ABORT, SHUTDOWN, ADD_LORA, REMOVE_LORA = 0, 1, 2, 3, 4
Command = tuple[int, Any]


@dataclass(slots=True)
class EngineRequest:
    """A request for the engine. `max_tokens`: the resolved max_tokens when the frontend has run
    `check_request` already (the engine then trusts it); None to have the engine check it. `lora_request`: the LoRA
    adapter it runs with (loaded by the engine if it is not yet), None for the base model."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    max_tokens: int | None = None
    lora_request: LoRARequest | None = None

    def __reduce__(self) -> tuple:
        return EngineRequest, (self.request_id, self.prompt, self.prompt_token_ids, self.params, self.max_tokens,
                               self.lora_request)


@dataclass(slots=True)
class Aborted:
    """A request the loop aborted while it ran: when, and the step times and tokens it had not handed out."""

    request_id: str
    when: float
    step_times: list[float]
    num_tokens: int

    def __reduce__(self) -> tuple:
        return Aborted, (self.request_id, self.when, self.step_times, self.num_tokens)


@dataclass(slots=True)
class EngineOutputs:
    """One hand-over of the loop: the steps run since the previous one, a merged delta per request that
    progressed, the requests the engine refused or aborted, the engine's stats, and the block hashes that
    entered and left its prefix cache and its host tier since the previous hand-over (the router's block report;
    `kv_events_seq`: the KV event batches published so far, the report then holds what batches before it said;
    None: no events published), and the outcomes of LoRA commands: (token, result or the exception it raised)."""

    num_steps: int
    deltas: list[RequestDelta]
    rejected: list[tuple[str, Exception]]
    aborted: list[Aborted]
    stats: Any
    cache_changes: tuple[list[int], list[int]] = ([], [])
    lora_results: list[tuple[int, Any]] = field(default_factory=list)
    host_changes: tuple[list[int], list[int]] = ([], [])
    kv_events_seq: int | None = None

    def __reduce__(self) -> tuple:
        return EngineOutputs, (self.num_steps, self.deltas, self.rejected, self.aborted, self.stats,
                               self.cache_changes, self.lora_results, self.host_changes, self.kv_events_seq)


class Link(Protocol):
    def receive(self, block: bool) -> list[Command] | None:
        """The commands that arrived (block: wait for at least one); None when the loop must stop."""

    def send(self, outputs: EngineOutputs) -> None:
        """Hand outputs to the frontend."""


def _rejection(exc: Exception) -> Exception:
    """What a refused request fails with on the frontend's side (plain enough to cross a pipe)."""
    if isinstance(exc, (RequestError, LoRAAdapterError)):
        return exc
    if isinstance(exc, ValueError):
        return RequestError(str(exc))
    return RuntimeError(f"{type(exc).__name__}: {exc}")


def run_busy_loop(engine: Any, link: Link, interval: float) -> None:
    """Drive `engine` until a shutdown command (or `link.receive` returns None). An exception of the engine
    itself (a broken step) propagates: the caller reports the engine dead."""
    monotonic = time.monotonic
    requests = engine.requests
    pending: dict[str, RequestDelta] = {}  # the deltas of the steps since the last hand-over, merged
    rejected: list[tuple[str, Exception]] = []
    aborted: list[Aborted] = []
    lora_results: list[tuple[int, Any]] = []
    num_steps = 0
    last_send = 0.0
    dirty = False  # something happened since the last hand-over (stats to refresh)

    def send(deltas: list[RequestDelta], steps: int) -> None:
        nonlocal rejected, aborted, lora_results, dirty
        manager, events = engine.block_manager, engine.kv_events
        link.send(EngineOutputs(steps, deltas, rejected, aborted, engine.stats(), manager.take_cache_changes(),
                                lora_results, manager.take_host_changes(), None if events is None else events.seq))
        rejected, aborted, lora_results = [], [], []
        dirty = False

    while True:
        busy = engine.has_unfinished_requests()
        if not busy and (dirty or pending or rejected or aborted):
            send(list(pending.values()), num_steps)
            pending, num_steps = {}, 0
        commands = link.receive(not busy)
        if commands is None:
            return
        for kind, item in commands:
            dirty = True
            if kind == ADD:
                try:
                    engine.add_request(item.request_id, item.prompt, item.prompt_token_ids, item.params,
                                       max_tokens=item.max_tokens, lora_request=item.lora_request)
                except Exception as exc:  # a refused request must not stop the engine
                    rejected.append((item.request_id, _rejection(exc)))
            elif kind == ADD_LORA or kind == REMOVE_LORA:
                token, arg = item
                try:
                    result = engine.add_lora(arg) if kind == ADD_LORA else engine.remove_lora(arg)
                except Exception as exc:  # a bad adapter must not stop the engine
                    result = _rejection(exc)
                lora_results.append((token, result))
            elif kind == ABORT:
                now = monotonic()
                for rid in item:
                    if rid not in requests:  # ended already: its last delta stands
                        continue
                    engine.abort_request(rid)
                    d = pending.pop(rid, None)  # what was not handed out yet dies with the request
                    aborted.append(Aborted(rid, now, [], 0) if d is None else
                                   Aborted(rid, now, d.step_times, d.num_new_tokens))
            else:
                return
        if lora_results and busy:  # answered before the next step (an idle loop sends at its next turn)
            send([], 0)
        if not engine.has_unfinished_requests():
            continue
        ended = False
        for delta in engine.step_deltas():
            earlier = pending.get(delta.request_id)
            if earlier is None:
                pending[delta.request_id] = delta
            else:
                earlier.merge(delta)
            ended = ended or delta.finished
        num_steps += 1
        t = monotonic()
        if t - last_send >= interval:
            send(list(pending.values()), num_steps)
            pending, num_steps = {}, 0
            last_send = t
        elif ended:  # requests that ended go out at once: their clients wait for the end, not for more tokens
            send([pending.pop(rid) for rid in [rid for rid, d in pending.items() if d.finished]], 0)

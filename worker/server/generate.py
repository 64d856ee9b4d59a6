"""Running one generation request, whichever the endpoint: admit it, submit its engine requests, answer in one
piece or as SSE, and abort whatever still runs however the handler ends (finished, error, timeout, client
gone, cancelled), so that the KV blocks are freed at once."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiohttp import web

from hetero_infer.contracts.lora import LoRARequest
from hetero_infer.contracts.sampling_params import SamplingParams
from hetero_infer.worker.core.busy_loop import EngineRequest
from hetero_infer.worker.core.outputs import OutputAccumulator
from hetero_infer.worker.frontend.stream import OutputStream
from hetero_infer.worker.server.errors import STREAM_ERRORS, APIError, as_api_error
from hetero_infer.worker.server.formatting import Formatter, dumps
from hetero_infer.worker.server.ids import new_id
from hetero_infer.worker.server.prompts import Prompt
from hetero_infer.worker.server.sse import stream_events
from hetero_infer.worker.server.state import ServerState


async def generate(request: web.Request, state: ServerState, prompts: list[Prompt], params: list[SamplingParams],
                   fmt: Formatter, arrival: float, stream: bool, include_usage: bool,
                   prepare: Callable[[], Awaitable[None]] | None = None,
                   lora_request: LoRARequest | None = None) -> web.StreamResponse:
    """`prepare`: awaited once the request is admitted, before it reaches the engine (its grammar's compile);
    `lora_request`: the LoRA adapter every prompt runs with (None: the base model)."""
    num_seqs = sum(max(p.n, p.best_of or 0) for p in params)  # best_of: every sample runs
    base = new_id()
    engine_requests = [EngineRequest(f"{base}-{i}", p.text, p.token_ids, sp, sp.max_tokens,  # checked already
                                     lora_request)
                       for i, (p, sp) in enumerate(zip(prompts, params, strict=True))]
    fmt.bind([r.request_id for r in engine_requests])
    with state.admit(num_seqs):  # 429/503 beyond capacity; counts the request for the drain
        if prepare is not None:  # admitted first: a full server refuses before any compile; waiting meanwhile
            await prepare()
        outputs = state.engine.submit(engine_requests, arrival)
        loop = asyncio.get_running_loop()
        timeout_s = state.options.request_timeout
        timer = loop.call_at(loop.time() + timeout_s, _time_out, state, outputs, timeout_s)
        try:
            if stream:
                return await stream_events(request, outputs, fmt, include_usage)
            return await _collect(outputs, engine_requests, fmt)
        finally:
            timer.cancel()
            # Client gone, cancelled, failed or timed out: free the KV blocks now (no-op once finished).
            state.engine.abort(outputs)


def _time_out(state: ServerState, stream: OutputStream, timeout_s: float) -> None:
    state.metrics.rejected("timeout")
    stream._fail(APIError(504, f"the request did not finish within the server's timeout of {timeout_s:g} s",
                          code="request_timeout"))


async def _collect(stream: OutputStream, requests: list[EngineRequest], fmt: Formatter) -> web.Response:
    acc = {r.request_id: OutputAccumulator(r.request_id, r.prompt, r.prompt_token_ids) for r in requests}
    try:
        while deltas := await stream.next_deltas():
            for delta in deltas:
                acc[delta.request_id].add(delta)
                fmt.note(delta)
    except STREAM_ERRORS as exc:
        raise as_api_error(exc) from None
    return web.Response(body=dumps(fmt.response([a.output() for a in acc.values()])).encode(),
                        content_type="application/json")

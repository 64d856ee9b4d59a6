"""`GET /v1/cache/blocks?epoch=E&since=N`: the block hashes this worker's prefix cache holds, for the router's
exact prefix index (format and semantics in docs/router.md).

The engine hands the hashes that entered and left its cache to the engine client with every batch of outputs
(`EngineOutputs.cache_changes`, across the process boundary of the process frontend too); the client keeps them
in a `BlockLog`, which answers with the net change since `since` when it can, else a snapshot. With KV events
(--kv-events-config) the report names their endpoint and topic, and `seq`: the event batches published when the
report's state was taken (it holds what batches before `seq` said; a subscriber resyncs from it).
"""

from __future__ import annotations

from aiohttp import web

from hetero_infer.worker.server.errors import APIError, unavailable
from hetero_infer.worker.server.state import get_state


async def cache_blocks(request: web.Request) -> web.Response:
    state = get_state(request)
    if not state.ready or state.limits is None:
        raise unavailable("the engine is not ready", "engine_not_ready")
    since_text = request.query.get("since")
    try:
        since = None if since_text in (None, "") else int(since_text)
    except ValueError:
        raise APIError(400, "since must be an integer", param="since") from None
    report = state.engine.block_log.to_json(request.query.get("epoch"), since, state.limits.block_size)
    # What the worker can absorb, for the router's load bound and cache placement.
    report.update(num_blocks=state.limits.num_blocks, max_num_seqs=state.max_num_seqs)
    if state.limits.kv_events is not None:  # where its KV events are published, and how far this report is
        endpoint, topic = state.limits.kv_events
        report["kv_events"] = {"endpoint": endpoint, "topic": topic, "seq": state.engine.kv_events_seq}
    return web.json_response(report)

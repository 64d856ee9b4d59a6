"""Why the worker pods do not serve (pure): the last words of a worker container that exited with an error.

A worker that refuses to start (a model that cannot be split over its GPUs, a device it does not have, a bad
option) exits 1 with the reason last in its log; with terminationMessagePolicy FallbackToLogsOnError the kubelet
keeps the log's tail (its last 2 KiB or 80 lines) as the container's termination message, in `state.terminated`
or, while it backs off between restarts, `lastState.terminated`. The worker logs JSON lines
(`{"level": "error", "msg": ..., "exc": ...}`): the reason is the last error record's msg, or, when the tail cut
that record's start off, the last line of its traceback. The operator puts it in the Ready condition's message
while replicas are missing (status.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from hetero_infer.operator.model_state import MAX_MESSAGE, error_line

WORKER_CONTAINER = "worker"  # manifests/worker.py's container


def worker_error_line(text: str) -> str:
    """The line that says why, out of a worker's termination message (its log's tail)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and str(record.get("level", "")).lower() in ("error", "critical") \
                and record.get("msg"):
            return str(record["msg"])
    if lines and lines[-1].endswith('"}') and "\\n" in lines[-1]:  # a JSON record cut at its start
        try:
            return str(json.loads('"' + lines[-1][:-2].rsplit("\\n", 1)[-1] + '"'))
        except ValueError:
            pass
    return error_line(text)


def worker_failure(pods: Sequence[Mapping[str, Any]]) -> str | None:
    """'pod P: the worker exited 1 (3 restart(s)): LINE' for the worker container that last exited with an error
    (now, or before its restart), among `pods`; None when none did."""
    found = []
    for pod in pods:
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            if status.get("name") != WORKER_CONTAINER:
                continue
            for terminated in ((status.get("state") or {}).get("terminated"),
                               (status.get("lastState") or {}).get("terminated")):
                if terminated and terminated.get("exitCode") not in (0, None):
                    found.append((str(terminated.get("finishedAt") or ""), pod, status, terminated))
                    break
    if not found:
        return None
    _, pod, status, terminated = max(found, key=lambda f: f[0])
    line = worker_error_line(str(terminated.get("message") or "")) or str(terminated.get("reason") or "Error")
    restarts = int(status.get("restartCount") or 0)
    text = (f"pod {(pod.get('metadata') or {}).get('name')}: the worker exited {terminated['exitCode']}"
            + (f" ({restarts} restart(s))" if restarts else "") + f": {line}")
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE - 3] + "..."

"""A worker that refuses to start (here: a model that cannot be split over its GPUs, the engine's own check and
its own JSON log line) shows why in the InferenceDeployment's Ready condition, from the worker container's
termination message (the log's tail, FallbackToLogsOnError), while replicas are missing."""

from __future__ import annotations

import logging
import sys
from typing import Any

import pytest
from test_operator_reconcile import FakeClient, current, infd, run

from hetero_infer.operator import constants as c
from hetero_infer.operator.manifests import selector_string
from hetero_infer.operator.worker_pods import worker_error_line, worker_failure
from hetero_infer.worker.runner.parallel.checks import check_split
from hetero_infer.worker.server.logs import JsonFormatter, TextFormatter

CONFIG = {"num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 64, "intermediate_size": 128}


def _refusal(formatter: logging.Formatter) -> tuple[str, str]:
    """(the worker's log, the reason): what `hetero-infer serve` logs when the engine refuses the model."""
    try:
        check_split(CONFIG, 3)
    except ValueError as exc:
        reason = f"{type(exc).__name__}: {exc}"
        record = logging.LogRecord("hetero_infer.server", logging.ERROR, __file__, 1, "could not load the engine: %s",
                                   (reason,), sys.exc_info())
    before = logging.LogRecord("hetero_infer.worker.core.engine", logging.INFO, __file__, 1, "config loaded", (), None)
    return formatter.format(before) + "\n" + formatter.format(record) + "\n", reason


@pytest.mark.parametrize("formatter", [JsonFormatter(), TextFormatter()], ids=["json", "text"])
def test_the_reason_is_read_from_the_log_tail(formatter: logging.Formatter) -> None:
    log, reason = _refusal(formatter)
    assert reason.startswith("ValueError: the model cannot be split over tensor_parallel_size=3: num_attention_heads=4")
    assert worker_error_line(log) == f"could not load the engine: {reason}"
    # the kubelet keeps the last 2 KiB: a record cut at its start still gives its traceback's last line
    assert worker_error_line(log[-(len(reason) + 40):]) == reason


def _pod(name: str, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "labels": dict(
        term.split("=", 1) for term in selector_string("smol").split(","))},
        "status": {"containerStatuses": [{"name": "worker", **status}]}}


def test_the_last_failed_worker_says_why() -> None:
    log, reason = _refusal(JsonFormatter())
    crashing = _pod("smol-a", restartCount=3, state={"waiting": {"reason": "CrashLoopBackOff"}}, lastState={
        "terminated": {"exitCode": 1, "reason": "Error", "message": log, "finishedAt": "2026-01-01T00:01:00Z"}})
    oom = _pod("smol-b", state={"terminated": {"exitCode": 137, "reason": "OOMKilled",
                                               "finishedAt": "2026-01-01T00:00:00Z"}})
    running = _pod("smol-c", state={"running": {}})
    assert worker_failure([running]) is None
    assert worker_failure([oom, crashing, running]) == f"pod smol-a: the worker exited 1 (3 restart(s)): could not load the engine: {reason}"
    assert worker_failure([oom]) == "pod smol-b: the worker exited 137: OOMKilled"


def test_the_ready_condition_carries_it_while_replicas_are_missing() -> None:
    client = FakeClient()
    infd(client, replicas=2, executor="torch", resources={"gpus": 3})
    run(client)
    log, reason = _refusal(JsonFormatter())
    pod = _pod("smol-a", restartCount=1, lastState={"terminated": {"exitCode": 1, "message": log}})
    client.objects[("Pod", "ns", "smol-a")] = pod
    run(client)
    ready = next(cd for cd in current(client)["status"]["conditions"] if cd["type"] == c.COND_READY)
    assert ready["status"] == "False" and ready["reason"] == "NoReplicasReady"
    assert ready["message"] == f"0/2 replicas ready; pod smol-a: the worker exited 1 (1 restart(s)): could not load the engine: {reason}"

    dep = client.objects[("Deployment", "ns", "smol")]
    dep["status"] = {"replicas": 2, "readyReplicas": 2, "updatedReplicas": 2, "availableReplicas": 2}
    run(client)
    ready = next(cd for cd in current(client)["status"]["conditions"] if cd["type"] == c.COND_READY)
    assert ready["status"] == "True" and "worker exited" not in ready["message"]

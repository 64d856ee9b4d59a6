"""A dead engine does not strand its GPU: a real worker's engine process killed with SIGKILL turns /healthz (the
liveness probe the operator renders) 503, so the kubelet's probes, replayed here on a compressed clock with the
rendered period and failureThreshold, decide a restart within a minute; the error stays readable meanwhile
(/readyz's and /healthz's bodies, the log) and is the last log line when the kubelet stops the container (exit
1: the pod's termination message, FallbackToLogsOnError)."""

from __future__ import annotations

import os
import signal
import threading
import time

from server_proc import ServerProcess, http
from test_engine_process import DEADLINE_S, _engine_pid

from hetero_infer.operator.manifests.common import Owner, WorkerDefaults
from hetero_infer.operator.manifests.worker import deployment
from hetero_infer.operator.spec import parse_spec

SECONDS_PER_PERIOD = 0.25  # the compressed clock: one probe period of the rendered probe takes this long here


def _worker_container() -> dict:
    spec = parse_spec({"model": {"name": "m"}, "resources": {"gpus": 1}})
    d = deployment(Owner("m", "default", "uid"), spec, WorkerDefaults())
    return d["spec"]["template"]["spec"]["containers"][0]


def _probe(url: str, path: str) -> bool:
    """One kubelet HTTP probe: success is a status in 200..399 within the timeout."""
    try:
        return 200 <= http("GET", url + path, timeout=3).status < 400
    except OSError:
        return False


def test_a_killed_engine_is_restarted_by_the_liveness_probe_with_its_error_readable() -> None:
    container = _worker_container()
    live = container["livenessProbe"]
    assert live["httpGet"]["path"] == "/healthz"
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    period, threshold = live["periodSeconds"], live["failureThreshold"]

    s = ServerProcess("--engine-process", "--max-model-len", "512")
    try:
        child = _engine_pid(s)
        assert all(_probe(s.url, "/healthz") for _ in range(threshold + 1))  # a healthy worker is never restarted
        os.kill(child, signal.SIGKILL)
        killed = time.monotonic()
        outcomes: list[tuple[float, bool]] = []  # (seconds after the kill on the pod's clock, probe passed)
        failures = 0
        while failures < threshold:  # the kubelet: restart after failureThreshold consecutive failures
            passed = _probe(s.url, "/healthz")
            outcomes.append((len(outcomes) * period, passed))
            failures = 0 if passed else failures + 1
            assert time.monotonic() - killed < DEADLINE_S, outcomes
            time.sleep(SECONDS_PER_PERIOD)
        restart_after_s = outcomes[-1][0] + period  # at most one period passes before the first probe sees it
        print("liveness probe after kill -9 (pod seconds, passed):", outcomes, "restart after", restart_after_s, "s")
        assert restart_after_s <= 60, outcomes

        # The failure is readable before the restart: both probes' bodies and the log say what happened.
        for path in ("/healthz", "/readyz"):
            r = http("GET", s.url + path)
            assert r.status == 503 and r.json()["status"] == "engine_failed", r.text
            assert "engine process exited (exit code -9)" in r.json()["error"], r.text
        assert any("exit code -9" in rec.get("msg", "") and rec.get("level") == "error"
                   for rec in s.records()), s.log()
    finally:
        code = s.stop(DEADLINE_S)  # what the kubelet does on a restart: SIGTERM
    assert code == 1, s.log()
    last = s.records()[-1]
    assert last["level"] == "error" and "engine failure" in last["msg"], s.log()


def test_a_healthy_worker_stays_alive_while_draining() -> None:
    """SIGTERM (a rollout, a scale-down) is no failure: /healthz stays 200 while the worker drains and it exits 0."""
    s = ServerProcess("--engine-process", "--max-model-len", "512", "--shutdown-grace", "30",
                      "--mock-step-latency-s", "0.05")
    done: dict = {}
    t = threading.Thread(target=lambda: done.setdefault("r", http(
        "POST", s.url + "/v1/completions", {"prompt": "x", "max_tokens": 40}, timeout=DEADLINE_S)))
    t.start()
    deadline = time.monotonic() + DEADLINE_S
    while s.metrics().get("hetero_infer_num_requests_running", 0) < 1:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    s.terminate()
    while http("GET", s.url + "/readyz").status == 200:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert http("GET", s.url + "/healthz").status == 200  # draining, not dead
    t.join(DEADLINE_S)
    assert done["r"].status == 200
    assert s.stop(DEADLINE_S) == 0, s.log()

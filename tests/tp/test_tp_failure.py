"""A tensor-parallel rank that dies takes the engine down within seconds with an error naming it: `LLM.generate`
raises; a server answers 503, ends its open streams and requests with an error and turns /readyz and /healthz red
(the kubelet restarts the pod); an idle server's engine process exits on its own. No client hangs."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time

import aiohttp
import psutil
import pytest

from hetero_infer import LLM, SamplingParams
from hetero_infer.worker.runner.executors import ExecutorDeadError
from tests.server.server_proc import ServerProcess, http

DEADLINE_S = 10.0  # "within seconds": each wait below ends in well under a second on a quiet machine
RANK_MODULE = "hetero_infer.worker.runner.parallel.rank"


def _signal_rank_while_generating(folder, sig: int, match: str) -> float:
    """Send rank 1 `sig` a second into a long generation; the seconds from then until `generate` raised."""
    llm = LLM(str(folder), device="cpu", dtype="float32", tensor_parallel_size=2)
    executor = llm.engine.executor
    sent = []

    def send() -> None:
        sent.append(time.monotonic())
        os.kill(executor.rank_pids[0], sig)

    timer = threading.Timer(1.0, send)
    timer.start()
    try:
        with pytest.raises(ExecutorDeadError, match=match):
            llm.generate(prompt_token_ids=[[1, 2, 3]] * 8, sampling_params=SamplingParams(max_tokens=500,
                                                                                           ignore_eos=True))
        assert sent
        return time.monotonic() - sent[0]
    finally:
        timer.cancel()
        executor.close()


@pytest.mark.slow  # the server test below checks the same, end to end
def test_a_killed_rank_fails_generate_within_seconds(tiny_model):
    folder, _ = tiny_model("llama")
    took = _signal_rank_while_generating(folder, signal.SIGKILL, r"tensor-parallel rank 1 \(pid \d+\) exited "
                                                                 r"with code -9")
    assert took < DEADLINE_S


def _rank_pids(server: ServerProcess) -> list[int]:
    procs = psutil.Process(server.proc.pid).children(recursive=True)
    return [p.pid for p in procs if RANK_MODULE in " ".join(p.cmdline())]


def _serve(folder) -> ServerProcess:
    return ServerProcess("--model", str(folder), "--device", "cpu", "--dtype", "float32", "--engine-process",
                         "--tensor-parallel-size", "2", "--max-model-len", "512", executor="torch",
                         start_timeout=180.0)


async def _until(condition, what: str) -> float:
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < DEADLINE_S, what
        await asyncio.sleep(0.02)
    return time.monotonic() - start


async def test_a_killed_rank_under_load_fails_streams_and_requests_and_turns_the_server_red(tiny_model):
    folder, _ = tiny_model("llama")
    s = _serve(folder)
    try:
        (rank,) = _rank_pids(s)
        async with aiohttp.ClientSession() as session:
            streaming = await session.post(s.url + "/v1/completions", json={
                "prompt": "doomed", "max_tokens": 450, "stream": True, "ignore_eos": True})
            assert streaming.status == 200
            await streaming.content.readline()  # the stream has started
            plain = asyncio.create_task(session.post(s.url + "/v1/completions", json={
                "prompt": "doomed too", "max_tokens": 450, "ignore_eos": True}))
            await _until(lambda: s.metrics()["hetero_infer_num_requests_running"] == 2, "both running")
            os.kill(rank, signal.SIGKILL)
            killed = time.monotonic()
            resp = await asyncio.wait_for(plain, DEADLINE_S)
            assert 500 <= resp.status < 600
            assert "tensor-parallel rank 1" in (await resp.json())["error"]["message"]
            text = await asyncio.wait_for(streaming.text(), DEADLINE_S)
            events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
            assert any('"error"' in e and "tensor-parallel rank 1" in e for e in events), events[-3:]
            assert time.monotonic() - killed < DEADLINE_S
        ready = http("GET", s.url + "/readyz")
        assert ready.status == 503 and ready.json()["status"] == "engine_failed"
        assert http("POST", s.url + "/v1/completions", {"prompt": "after", "max_tokens": 2}).status == 503
        assert http("GET", s.url + "/healthz").status == 503  # liveness fails: the kubelet restarts the pod
        assert not _rank_pids(s)  # no rank left behind
    finally:
        s.stop()


@pytest.mark.slow
async def test_a_rank_killed_while_idle_takes_the_engine_process_down(tiny_model):
    folder, _ = tiny_model("llama")
    s = _serve(folder)
    try:
        (rank,) = _rank_pids(s)
        assert http("GET", s.url + "/readyz").status == 200
        os.kill(rank, signal.SIGKILL)
        took = await _until(lambda: http("GET", s.url + "/readyz").status == 503, "readyz red")
        assert http("POST", s.url + "/v1/completions", {"prompt": "after", "max_tokens": 2}).status == 503
        assert any("tensor-parallel rank 1" in line for line in s.lines), s.log()[-2000:]
        print(f"an idle engine turned red {took:.2f} s after its rank was killed")
    finally:
        s.stop()


@pytest.mark.slow
def test_a_hung_rank_fails_generate_after_the_collective_timeout(tiny_model, monkeypatch):
    monkeypatch.setenv("HETERO_INFER_TP_TIMEOUT_S", "3")
    folder, _ = tiny_model("llama")
    took = _signal_rank_while_generating(folder, signal.SIGSTOP, "tensor-parallel step failed: .*Timed out")
    assert took < 3 + DEADLINE_S


@pytest.mark.slow  # ~20 s of a server's start; test_tp_engine.py checks the same refusal in the engine, cheaply
def test_a_worker_whose_model_cannot_be_split_exits_1_with_the_reason(tiny_model):
    """The check at worker start (the operator cannot read config.json): exit 1, the reason as the last words."""
    folder, _ = tiny_model("llama")  # 4 attention heads
    done = subprocess.run([sys.executable, "-m", "hetero_infer.cli", "serve", "--model", str(folder), "--port", "0",
                           "--device", "cpu", "--tensor-parallel-size", "3"],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 1
    assert "the model cannot be split over tensor_parallel_size=3: num_attention_heads=4 is not divisible by 3" in \
        done.stdout + done.stderr

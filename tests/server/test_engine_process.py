"""Process mode (`--engine-process`; the default with 2 or more CPUs): the engine core runs in a child process.

Same outputs as thread mode; a killed engine child turns /readyz red and fails open requests (never a hang);
shutdown leaves no child behind.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import aiohttp
import pytest
from server_proc import ServerProcess, http

from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.contracts.sampling_params import SamplingParams
from hetero_infer.worker.core.engine import LLMEngine
from hetero_infer.worker.core.request_check import EngineLimits, check_request

DEADLINE_S = 60.0  # generous: each condition awaited below is met within a second or two on a quiet machine


async def _wait_for(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)


def _children(pid: int) -> list[int]:
    """Live engine-core processes whose parent is `pid` (Linux /proc; not multiprocessing's resource tracker)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    cmdline = f.read()
            except OSError:
                continue
            if b"resource_tracker" not in cmdline:
                out.append(int(name))
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _engine_pid(s: ServerProcess) -> int:
    kids = _children(s.proc.pid)
    assert len(kids) == 1, kids
    return kids[0]


_REQUESTS = [
    ("/v1/completions", {"prompt": "the same in both modes", "max_tokens": 24, "temperature": 1.0, "seed": 7, "n": 2}),
    ("/v1/completions", {"prompt": [5, 17, 300, 42], "max_tokens": 16, "temperature": 0.8, "top_p": 0.9,
                         "seed": 11, "echo": True}),
    ("/v1/completions", {"prompt": "stop here", "max_tokens": 30, "temperature": 1.0, "seed": 3,
                         "stop": ["e"]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 20, "seed": 5,
                              "temperature": 1.0}),
]


def _strip(body: dict) -> dict:
    body = dict(body)
    for key in ("id", "created", "system_fingerprint"):
        body.pop(key, None)
    return body


async def _collect(url: str) -> list:
    results = []
    async with aiohttp.ClientSession() as session:
        for path, body in _REQUESTS:
            async with session.post(url + path, json=body) as resp:
                assert resp.status == 200, await resp.text()
                results.append(_strip(await resp.json()))
            async with session.post(url + path, json={**body, "stream": True}) as resp:
                assert resp.status == 200
                chunks = [line[6:] for line in (await resp.text()).splitlines() if line.startswith("data: ")]
                assert chunks[-1] == "[DONE]"
                results.append(_merge([json.loads(c) for c in chunks[:-1]]))
    return results


def _merge(chunks: list[dict]) -> dict:
    """A stream as what it says, not how it was cut into chunks (coalescing depends on timing)."""
    merged: dict = {}
    for chunk in chunks:
        for choice in chunk.get("choices", []):
            m = merged.setdefault(choice["index"], {"text": "", "finish_reason": None})
            delta = choice.get("delta") or {}
            m["text"] += choice.get("text") or delta.get("content") or ""
            m["finish_reason"] = choice.get("finish_reason") or m["finish_reason"]
            if choice.get("logprobs"):
                m.setdefault("logprobs", []).append(choice["logprobs"])
    return merged


@pytest.mark.slow  # two servers side by side (~25 s)
async def test_outputs_identical_between_thread_and_process_modes() -> None:
    got = {}
    for flag in ("--engine-process", "--no-engine-process"):
        s = ServerProcess(flag, "--max-model-len", "512")
        try:
            assert (len(_children(s.proc.pid)) == 1) == (flag == "--engine-process")
            got[flag] = await _collect(s.url)
        finally:
            assert s.stop(DEADLINE_S) == 0, s.log()
    assert got["--engine-process"] == got["--no-engine-process"]


async def test_killed_engine_child_fails_requests_and_readyz() -> None:
    s = ServerProcess("--engine-process", "--mock-step-latency-s", "0.05", "--max-model-len", "512")
    try:
        child = _engine_pid(s)
        async with aiohttp.ClientSession() as session:
            # 400 tokens at 50 ms: 20 s; both are still running when the child is killed
            streaming = await session.post(s.url + "/v1/completions",
                                           json={"prompt": "doomed", "max_tokens": 400, "stream": True})
            assert streaming.status == 200
            plain = asyncio.create_task(session.post(s.url + "/v1/completions",
                                                     json={"prompt": "doomed too", "max_tokens": 400}))
            await _wait_for(lambda: s.metrics()["hetero_infer_num_requests_running"] == 2)
            os.kill(child, signal.SIGKILL)
            resp = await asyncio.wait_for(plain, DEADLINE_S)
            assert 500 <= resp.status < 600
            assert "error" in await resp.json()
            text = await asyncio.wait_for(streaming.text(), DEADLINE_S)
            events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
            assert any('"error"' in e for e in events), events
        ready = http("GET", s.url + "/readyz")
        assert ready.status == 503 and ready.json()["status"] == "engine_failed"
        refused = http("POST", s.url + "/v1/completions", {"prompt": "after", "max_tokens": 2})
        assert refused.status == 503
        assert http("GET", s.url + "/healthz").status == 503  # liveness fails: the kubelet restarts the pod
    finally:
        s.stop()


def test_shutdown_leaves_no_child_process() -> None:
    s = ServerProcess("--engine-process", "--max-model-len", "512")
    child = _engine_pid(s)
    assert http("POST", s.url + "/v1/completions", {"prompt": "x", "max_tokens": 3}).status == 200
    assert s.stop(DEADLINE_S) == 0, s.log()
    deadline = time.monotonic() + DEADLINE_S
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


@pytest.mark.slow  # a server process killed with its engine child (~30 s)
def test_killed_server_takes_the_engine_child_along() -> None:
    s = ServerProcess("--engine-process", "--max-model-len", "512")
    child = _engine_pid(s)
    s.proc.kill()
    s.proc.wait()
    deadline = time.monotonic() + DEADLINE_S
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


@pytest.mark.parametrize("ids,params", [
    ([], SamplingParams(max_tokens=4)),
    ([1, 2, 10**9], SamplingParams(max_tokens=4)),
    ([1] * 600, SamplingParams(max_tokens=4)),
    ([1, 2, 3], SamplingParams(max_tokens=600)),
    ([1, 2, 3], SamplingParams(max_tokens=8)),
    ([1, 2, 3], SamplingParams()),
])
def test_validation_function_matches_engine(ids: list[int], params: SamplingParams) -> None:
    engine = _engine()

    def run(f):
        try:
            return f()
        except ValueError as exc:
            return str(exc)

    bm = engine.block_manager
    limits = EngineLimits(engine.model_name, engine.max_model_len, engine.vocab_size, bm.num_blocks, bm.block_size,
                          tuple(engine.eos_token_ids))
    assert run(lambda: engine.check_request(ids, params)) == run(lambda: check_request(ids, params, limits))


def test_engine_process_option() -> None:
    from hetero_infer.contracts.server_options import ENGINE_PROCESS_MIN_CPUS, ServerOptions
    from hetero_infer.kernels.cpu.threads import usable_cpus
    from hetero_infer.worker.server.cli import _server_env, build_parser

    assert ServerOptions().use_engine_process() == (usable_cpus() >= ENGINE_PROCESS_MIN_CPUS)
    assert ServerOptions(engine_process=True).use_engine_process()
    assert not ServerOptions(engine_process=False).use_engine_process()
    assert build_parser().parse_args(["--no-engine-process"]).engine_process is False
    assert build_parser().parse_args(["--engine-process"]).engine_process is True
    assert build_parser().parse_args([]).engine_process is None
    assert _server_env({"HETERO_INFER_ENGINE_PROCESS": "auto"}) == {"engine_process": None}
    assert _server_env({"HETERO_INFER_ENGINE_PROCESS": "0"}) == {"engine_process": False}
    with pytest.raises(ValueError):
        _server_env({"HETERO_INFER_ENGINE_PROCESS": "maybe"})


_ENGINE: list[LLMEngine] = []


def _engine() -> LLMEngine:
    if not _ENGINE:
        _ENGINE.append(LLMEngine(EngineConfig(executor="mock", max_model_len=512, max_num_blocks=64)))
    return _ENGINE[0]


@pytest.mark.slow  # an engine process started for its log format (~30 s)
def test_engine_process_logs_in_the_servers_format() -> None:
    """The child's records (loading, failures) reach the server's stderr as the server's own do: JSON lines, at
    the server's level (info by default; Python's default, warning, would drop this one)."""
    s = ServerProcess("--engine-process")
    try:
        mine = [r for r in s.records() if r.get("logger") == "hetero_infer.engine_process"]
        assert mine and "loaded (executor mock" in mine[0]["msg"] and mine[0]["level"] == "info"
    finally:
        s.stop()


async def test_a_request_reaches_the_engine_before_the_loop_turns() -> None:
    """Commands go to the child as they come (not at the end of the loop's turn): when a wave of requests
    arrives, the engine starts on the first while the loop still parses the others."""
    from hetero_infer.worker.core.busy_loop import EngineRequest
    from hetero_infer.worker.frontend.process import EngineProcess, ProcessEngineClient

    core = EngineProcess(EngineConfig(executor="mock", max_model_len=512, max_num_blocks=64))
    core.start()
    core.wait_ready()
    engine = ProcessEngineClient(core)
    engine.start()
    try:
        stream = engine.submit([EngineRequest("r0", None, [5, 6, 7], SamplingParams(max_tokens=3, ignore_eos=True))])
        # No await since the submit: the loop has not turned, yet the child got the request and answers.
        readable, _, _ = select.select([core.out_conn.fileno()], [], [], DEADLINE_S)
        assert readable, "the engine heard nothing of the request before the loop turned"
        outputs = []
        while out := await stream.next():
            outputs = out
        assert outputs[0].finished and len(outputs[0].outputs[0].token_ids) == 3
    finally:
        engine.shutdown()


@pytest.mark.slow  # a stalled engine process (~40 s)
async def test_loop_stays_responsive_when_the_engine_does_not_read_its_commands() -> None:
    """Commands the engine process has not read yet wait in the server, not in a blocking write: a stopped (or
    very slow) engine with more pending prompt bytes than its pipe holds must not freeze the event loop."""
    s = ServerProcess("--engine-process", "--max-model-len", "8192", "--max-num-blocks", "40000",
                      "--max-num-seqs", "64", "--max-queue-len", "64")
    child = _engine_pid(s)
    try:
        prompt = list(range(1000, 9000))  # ~24 KB pickled: 64 of them are more than a 1 MB pipe holds
        async with aiohttp.ClientSession() as session:
            os.kill(child, signal.SIGSTOP)
            try:
                posts = [asyncio.create_task(session.post(s.url + "/v1/completions",
                                                          json={"prompt": prompt, "max_tokens": 2}))
                         for _ in range(64)]
                # The loop answers probe after probe while the stopped child reads nothing: a loop blocked in a
                # write to the full pipe would answer none until the child is continued (any deadline catches it).
                for _ in range(20):
                    async with session.get(s.url + "/healthz", timeout=aiohttp.ClientTimeout(DEADLINE_S)) as health:
                        assert health.status == 200
                    await asyncio.sleep(0.1)
            finally:
                os.kill(child, signal.SIGCONT)
            responses = await asyncio.wait_for(asyncio.gather(*posts), 2 * DEADLINE_S)
            for resp in responses:
                assert resp.status == 200, await resp.text()
                assert (await resp.json())["usage"]["completion_tokens"] == 2
    finally:
        s.stop()


def test_command_frames_are_what_the_child_reads() -> None:
    """The server writes commands itself (non-blocking); the child reads them with Connection.recv_bytes."""
    import multiprocessing

    from hetero_infer.worker.frontend.process import _frame

    reader, writer = multiprocessing.Pipe(duplex=False)
    try:
        for payload in (b"", b"x", bytes(range(256)) * 80):  # empty, tiny, and beyond the 16 KB split of send_bytes
            os.write(writer.fileno(), _frame(payload))
            assert reader.recv_bytes() == payload
    finally:
        reader.close()
        writer.close()


def test_the_http_side_listens_without_torch() -> None:
    """What the server needs to bind its port, answer /healthz and spawn the engine process imports neither torch
    nor transformers (seconds): those load in the engine process and, for the server's own tokenizer, on a thread
    while the engine process loads, so the two processes' imports overlap."""
    probe = (
        "import sys\n"
        "import hetero_infer.worker.server.cli, hetero_infer.worker.server.logs\n"
        "from hetero_infer.contracts.server_options import ServerOptions\n"
        "from hetero_infer.worker.frontend.process import EngineProcess\n"
        "from hetero_infer.worker.server.app import create_app\n"
        "from hetero_infer.worker.server.state import ServerState\n"
        "create_app(ServerState(ServerOptions()))\n"
        "ServerOptions().use_engine_process()\n"
        "print(sorted(m for m in ('torch', 'transformers', 'numpy') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout


def test_the_engine_process_names_its_model_folder_before_it_loads() -> None:
    """The child resolves the model (a GGUF is converted once, into a folder) and says so before it builds the
    engine: the server loads its tokenizer from that folder meanwhile. A model that cannot be fetched fails in
    the parent as the child's ModelSourceError, one line."""
    from hetero_infer.model_source import ModelSourceError
    from hetero_infer.worker.frontend.process import EngineProcess
    from hetero_infer.worker.runner.loader import default_model_gguf, resolve_model

    core = EngineProcess(EngineConfig(model=str(default_model_gguf()), executor="mock", max_model_len=512,
                                      max_num_blocks=64))
    core.start()
    try:
        pinned = core.wait_pinned()
        assert (pinned.model, pinned.served_model_name) == (str(resolve_model(None)[0]), default_model_gguf().stem)
    finally:
        core.stop(0.5)  # while it builds the engine
    assert not core.process.is_alive()

    core = EngineProcess(EngineConfig(model="s3://", executor="mock"))
    core.start()
    try:
        with pytest.raises(ModelSourceError) as info:
            core.wait_pinned()
        assert str(info.value) == "malformed model URL 's3://': expected s3://BUCKET/PREFIX"
    finally:
        core.stop(5.0)


def test_a_stop_while_loading_ends_server_and_engine_at_once() -> None:
    """SIGTERM while the engine process still loads the real model: the server exits 0 within a few seconds and
    its engine process with it (a loading child reads no commands, so it is not asked and waited for)."""
    from cli_process import CliProcess

    s = CliProcess("serve", "--port", "0", "--engine-process", "--log-format", "json")
    try:
        deadline = time.monotonic() + 60
        while not _children(s.proc.pid):
            assert time.monotonic() < deadline, s.log()
            time.sleep(0.05)
        child = _children(s.proc.pid)[0]
        started = time.monotonic()
        assert s.stop(timeout=30) == 0, s.log()
        assert time.monotonic() - started < 2.0, s.log()
        assert "stopped while loading the model" in s.log()
        deadline = time.monotonic() + 5
        while os.path.exists(f"/proc/{child}") and _state(child) != "Z":
            assert time.monotonic() < deadline, "the engine process outlived its server"
            time.sleep(0.05)
    finally:
        s.stop()


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"

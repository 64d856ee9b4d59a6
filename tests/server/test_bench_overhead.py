"""The serving-overhead benchmark's HTTP load generators (`bench_overhead.run_http`): the lean keep-alive client
and the aiohttp one count the same tokens against a real server."""

from __future__ import annotations

import pytest
from server_proc import ServerProcess

from hetero_infer.worker.server.bench_overhead import _prompts, run_http


@pytest.mark.parametrize("client", ["lean", "aiohttp"])
async def test_load_generators_count_every_token(server: ServerProcess, client: str) -> None:
    prompts = _prompts(12, 16, seed=1)
    run = await run_http(server.url, prompts, 9, 4, server_pid=server.proc.pid, client=client)
    assert run.tokens == 12 * 9
    assert len(run.latencies) == 12 and all(t > 0 for t in run.latencies)
    assert run.cpu_seconds is not None and run.client_cpu_seconds is not None


async def test_lean_client_reports_an_error_status(server: ServerProcess) -> None:
    with pytest.raises(RuntimeError, match="unexpected response"):
        await run_http(server.url, [[]], 4, 1, client="lean")  # an empty prompt: 400


def test_baseline_checkout_is_what_the_baseline_server_imports(tmp_path) -> None:
    """`--baseline CHECKOUT`: the second server must run that checkout's code, not this one's."""
    import os
    import subprocess
    import sys

    from hetero_infer.worker.server.bench_overhead import importable_checkout

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    folder = importable_checkout(repo, str(tmp_path))
    out = subprocess.run(
        [sys.executable, "-c", "import hetero_infer.cli, hetero_infer.worker.server.serving as m; print(m.__file__)"],
        env={**os.environ, "PYTHONPATH": folder}, cwd=folder, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == os.path.join(folder, "hetero_infer", "worker", "server", "serving.py")

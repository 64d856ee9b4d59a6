"""The serving-overhead benchmark's HTTP load generators (`bench_overhead.run_http`): the lean keep-alive client
and the aiohttp one count the same tokens against a real server."""

from __future__ import annotations

import pytest
from server_proc import ServerProcess

from hetero_infer.bench.overhead import _prompts, run_http


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

    from hetero_infer.bench.overhead import importable_checkout

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    folder = importable_checkout(repo, str(tmp_path))
    out = subprocess.run(
        [sys.executable, "-c", "import hetero_infer.cli, hetero_infer.worker.server.app as m; print(m.__file__)"],
        env={**os.environ, "PYTHONPATH": folder}, cwd=folder, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == os.path.join(folder, "hetero_infer", "worker", "server", "app.py")


@pytest.mark.slow  # the whole overhead benchmark (~40 s)
def test_benchmark_runs_end_to_end_and_counts_its_rounds(capsys) -> None:
    """The whole command, tiny: a table with every path, and the rounds probed for CPU speed."""
    import gc

    from hetero_infer.bench.overhead import main

    threshold = gc.get_threshold()
    try:
        assert main(["--repeats", "2", "--num-requests", "8", "--concurrency", "4", "--input-len", "8",
                     "--output-len", "4", "--probe-seconds", "0.05", "--max-model-len", "256"]) == 0
    finally:  # the benchmark sets the garbage collector as a server does; the other tests expect the default
        gc.unfreeze()
        gc.set_threshold(*threshold)
    out = capsys.readouterr().out
    rows = {line.split("|")[1].strip() for line in out.splitlines() if line.startswith("| ")}
    assert {"engine", "async engine", "HTTP"} <= rows
    assert "Rounds at full speed" in out and "of 2" in out


def test_slowdown_is_the_slowest_cpus_median_over_the_fastest_sample() -> None:
    from hetero_infer.bench.cpu_speed import slowdown

    assert slowdown({0: [6.0, 6.2, 6.1], 1: [11.0, 12.0, 11.5]}, 6.0) == 11.5 / 6.0
    assert slowdown({0: [6.0]}, 6.0) == 1.0

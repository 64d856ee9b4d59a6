"""Real processes for the router's end-to-end tests: `hetero-infer serve --executor mock` workers and
`hetero-infer router`, each on a free port read from its log."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

from cli_process import CliProcess
from prometheus_client.parser import text_string_to_metric_families


def get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def samples(url: str, name: str) -> dict[str, float]:
    """{label values joined by ',': value} of one metric (counters by their _total sample)."""
    _, text = get(url + "/metrics")
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            if s.name == name:
                out[",".join(v for k, v in sorted(s.labels.items()) if k != "model_name")] = s.value
    return out


Proc = CliProcess  # the router's and its mock workers' processes


def start_workers(n: int, *args: str, extra: dict[int, list[str]] | None = None) -> list[Proc]:
    """`n` mock workers started side by side (each pays its imports at once), all ready; worker i also gets
    `extra[i]` (later flags win)."""
    out: list[Proc | BaseException] = [RuntimeError("not started")] * n

    def one(i: int) -> None:
        try:
            p = Proc("serve", "--port", "0", "--executor", "mock", "--no-engine-process", "--log-format", "json",
                     "--no-access-log", *args, *(extra or {}).get(i, []))
            out[i] = p
            p.wait_ready()
        except BaseException as exc:  # reported below
            out[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = [o for o in out if isinstance(o, BaseException)]
    if errors:
        for o in out:
            if isinstance(o, Proc):
                o.stop()
        raise RuntimeError(f"worker start failed: {errors[0]}")
    return out  # type: ignore[return-value]


def start_router(workers: list[Proc], *args: str, env: dict[str, str] | None = None, at_once: bool = False) -> Proc:
    """A router in front of `workers`, once it sees them all ready and, unless `--tokenizer none`, has its tokenizer
    (with the default `--tokenizer workers` it is fetched from them in the background: waiting for it keeps a test
    from seeing the switch from text to token hashes halfway); `at_once`: as soon as it listens, as a user starts
    one (traffic before its first poll of the workers)."""
    worker_args = [a for w in workers for a in ("--worker", w.url)]
    router = Proc("router", "--port", "0", *worker_args, "--health-interval-s", "0.2", *args, env=env)
    router.wait_ready()
    if at_once:
        return router
    tokenizer = args[args.index("--tokenizer") + 1] if "--tokenizer" in args else "workers"
    deadline = time.monotonic() + 120
    while (json.loads(get(router.url + "/readyz")[1])["workers_ready"] < len(workers)
           or (tokenizer != "none" and workers
               and samples(router.url, "hetero_infer_router_tokenizer_mode").get("text") != 0.0)):
        if time.monotonic() > deadline:
            raise RuntimeError("router never saw the workers ready or loaded no tokenizer:\n" + "".join(router.lines))
        time.sleep(0.1)
    return router


def wait_index_synced(router_url: str, worker_urls: list[str], timeout: float = 60.0) -> None:
    """Wait until the router's index holds as many blocks per worker as each worker's block report."""
    deadline = time.monotonic() + timeout
    while True:
        index = samples(router_url, "hetero_infer_router_index_blocks")
        reported = [len(json.loads(get(u + "/v1/cache/blocks")[1])["added"]) for u in worker_urls]
        if all(index.get(u) == n for u, n in zip(worker_urls, reported)):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"the router's index never caught up: {index} vs {reported}")
        time.sleep(0.05)

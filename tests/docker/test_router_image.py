"""The router (spec.router, issue 14) from the operator image, in front of two mock workers from the CPU worker
image, on a user-defined network, each container run as the operator's Deployments run it
(`python -m pytest -m docker tests/docker`; docs/images.md has the last results).

The router's Deployment watches EndpointSlices (--discover-service); without a cluster it gets the workers'
addresses with --worker instead, everything else as rendered. Only its port is published, on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import openai
import pytest
from docker_run import (
    container,
    docker,
    free_port,
    get_json,
    metric_families,
    network,
    pod_run_options,
    stop,
    unique_name,
    wait_for,
    wait_ready,
)
from prometheus_client.parser import text_string_to_metric_families

from hetero_infer.operator import constants as c
from hetero_infer.operator.manifests import WORKER_UID, Owner, WorkerDefaults, deployment, router_deployment
from hetero_infer.operator.spec import parse_spec

pytestmark = [pytest.mark.docker, pytest.mark.timeout(3600)]

WORKERS = 2
MODEL = "smollm2"
ROUTER_SERIES = ("hetero_infer_router_requests_routed", "hetero_infer_router_responses",
                 "hetero_infer_router_workers_ready", "hetero_infer_router_requests_in_flight",
                 "hetero_infer_router_upstream_ttft_seconds", "hetero_infer_router_requests_held")


def with_workers(args: list[str], urls: list[str]) -> list[str]:
    """The rendered router arguments with --discover-service/--namespace replaced by --worker URL each."""
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in ("--discover-service", "--namespace"):
            skip = True
        else:
            out.append(arg)
    for url in urls:
        out += ["--worker", url]
    return out


def routed(base: str) -> dict[tuple[str, str], float]:
    """hetero_infer_router_requests_routed_total by (worker, policy)."""
    family = metric_families(base).get("hetero_infer_router_requests_routed")
    return {(s.labels["worker"], s.labels["policy"]): s.value
            for s in (family.samples if family else []) if s.name.endswith("_total")}


def changed(before: dict[Any, float], after: dict[Any, float]) -> set[Any]:
    return {key for key, value in after.items() if value != before.get(key, 0.0)}


def test_router_from_the_operator_image_in_front_of_mock_workers(operator_image: str,
                                                                 worker_cpu_image: str) -> None:
    spec = parse_spec({"model": {"name": MODEL}, "executor": "mock", "replicas": WORKERS,
                       "router": {"enabled": True, "policy": "prefix"}}, "smol")
    owner = Owner("smol", "models", "uid-1")
    defaults = WorkerDefaults(image=worker_cpu_image, router_image=operator_image)
    worker_pod = deployment(owner, spec, defaults)["spec"]["template"]["spec"]
    router_pod = router_deployment(owner, spec, defaults)["spec"]["template"]["spec"]
    (worker,) = worker_pod["containers"]
    (router,) = router_pod["containers"]
    assert router["image"] == operator_image

    # The router runs as the image's own user (no --user), which must be the non-root UID the pod asks for.
    config = json.loads(docker("image", "inspect", "--format", "{{json .Config}}", operator_image).stdout)
    assert config["User"] == f"{WORKER_UID}:{WORKER_UID}" == \
        f"{router_pod['securityContext']['runAsUser']}:{router_pod['securityContext']['runAsGroup']}"

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with contextlib.ExitStack() as stack:
        net = stack.enter_context(network())
        names = [unique_name(f"worker{i}") for i in range(WORKERS)]
        urls = [f"http://{name}:{c.WORKER_PORT}" for name in names]
        for name in names:
            stack.enter_context(container(worker_cpu_image, *worker["args"], network=net, name=name,
                                          options=tuple(pod_run_options(worker_pod, worker))))
        options = [*pod_run_options(router_pod, router, user=False), "-p", f"127.0.0.1:{port}:{c.WORKER_PORT}"]
        args = with_workers(router["args"], urls)
        assert args[args.index("--policy") + 1] == "prefix"
        name = stack.enter_context(container(operator_image, *args, options=tuple(options), network=net))
        check_router(name, base, urls)
        check_exact_chat_hashes(name, base, dict(zip(urls, names)))


def check_router(name: str, base: str, urls: list[str]) -> None:
    # Ready at once, workers or not (requests are held); then both workers pass the router's health checks.
    wait_ready(name, base, 180)
    wait_for(name, lambda: get_json(f"{base}/readyz")["workers_ready"] == WORKERS, 300, "both workers ready")

    status = docker("exec", name, "cat", "/proc/1/status", "/proc/1/cmdline").stdout
    uids = next(line.split()[1:] for line in status.splitlines() if line.startswith("Uid:"))
    assert uids == [str(WORKER_UID)] * 4, status
    assert "router" in status, status

    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)
    assert MODEL in [m.id for m in client.models.list().data]

    done = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4)
    assert done.choices[0].finish_reason in ("length", "stop") and done.usage.completion_tokens >= 1, done

    stream = client.completions.create(model=MODEL, prompt="Write a long story about a dragon.", max_tokens=6,
                                       stream=True, extra_body={"ignore_eos": True})
    chunks = list(stream)
    finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finish == ["length"], chunks
    assert sum(1 for ch in chunks if ch.choices and ch.choices[0].text) >= 1, chunks

    # Policy prefix: the same long prompt twice goes to the worker that already holds it.
    prompt = "You are a helpful assistant who answers in one short sentence. " * 4 + "Name a colour."
    sent: list[set[tuple[str, str]]] = []
    for _ in range(2):
        before = routed(base)
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=2)
        sent.append(changed(before, routed(base)))
    assert len(sent[0]) == 1 and sent[0] == sent[1], sent

    families = metric_families(base)
    missing = [series for series in ROUTER_SERIES if series not in families]
    assert not missing, f"{missing} not on the router's /metrics: {sorted(families)}"
    assert families["hetero_infer_router_workers_ready"].samples[0].value == WORKERS
    # Completions are routed by the prefix policy (GET /v1/models is the router's own answer: the union of the
    # workers' lists, neither routed nor counted among the responses).
    labels = set(routed(base))
    assert {worker for worker, _ in labels} <= set(urls) and {p for _, p in labels} <= {"prefix", "least-load"}, labels
    assert {p for _, p in sent[0]} == {"prefix"}, sent
    ok = sum(s.value for s in families["hetero_infer_router_responses"].samples
             if s.name.endswith("_total") and s.labels["code"] == "200")
    assert ok >= 4, families["hetero_infer_router_responses"].samples  # the completion, the stream, the prefix pair



def worker_get(container_name: str, path: str) -> str:
    """GET a worker's path from inside its container (only the router's port is published)."""
    code = (f"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{c.WORKER_PORT}{path}', "
            "timeout=10).read().decode())")
    return docker("exec", container_name, "python", "-c", code).stdout


def worker_hits(container_name: str) -> float:
    families = {f.name: f for f in text_string_to_metric_families(worker_get(container_name, "/metrics"))}
    return sum(s.value for s in families["hetero_infer_prefix_cache_hits"].samples if s.name.endswith("_total"))


def router_samples(base: str, name: str) -> dict[str, float]:
    family = metric_families(base).get(name)
    return {s.labels.get("worker", s.labels.get("mode", "")): s.value
            for s in (family.samples if family else []) if s.name in (name, name + "_total")}


def check_exact_chat_hashes(name: str, base: str, workers: dict[str, str]) -> None:
    """The router in the operator image (no model, no torch) loads the workers' tokenizer from them (GET
    /v1/tokenizer/files, the default --tokenizer workers) and hashes chat prompts into the very blocks the
    workers cache: for every chat request, the tokens it predicted the chosen worker holds are the prefix-cache
    hits that worker then reports."""
    wait_for(name, lambda: router_samples(base, "hetero_infer_router_tokenizer_mode").get("workers") == 1, 300,
             "the router loaded the workers' tokenizer")
    assert router_samples(base, "hetero_infer_router_tokenizer_mode") == {"workers": 1, "folder": 0, "text": 0}
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)
    system = "You are a helpful assistant who answers in one short sentence and never guesses. " * 4
    total = 0.0
    for i in range(4):
        hits = {u: worker_hits(n) for u, n in workers.items()}
        matched = router_samples(base, "hetero_infer_router_prefix_matched_tokens")
        client.chat.completions.create(model=MODEL, max_tokens=2, messages=[
            {"role": "system", "content": system}, {"role": "user", "content": f"Question {i}: name a colour."}])

        def synced() -> bool:
            index = router_samples(base, "hetero_infer_router_index_blocks")
            return all(index.get(u) == len(json.loads(worker_get(n, "/v1/cache/blocks"))["added"])
                       for u, n in workers.items())

        wait_for(name, synced, 60, "the router's index to equal the workers' block reports")
        after = router_samples(base, "hetero_infer_router_prefix_matched_tokens")
        for u, n in workers.items():
            got = worker_hits(n) - hits[u]
            assert got == after.get(u, 0.0) - matched.get(u, 0.0), (i, u, got, after, matched)
            total += got
    assert total >= 3 * 3 * 16, total  # requests 2-4 found the system prompt (4 blocks) where the router sent them
    assert stop(name, timeout=120) == 0

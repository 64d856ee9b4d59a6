"""DNS rebinding (issue 27): a server on loopback without an API key answers only to IP addresses, localhost and
the names of --allowed-hosts, as Jupyter and Vite do; bound to all interfaces, or with an API key, to any name.
In-process around a real mock-executor engine, over real sockets; the policy itself as pure logic."""

from __future__ import annotations

import json

import aiohttp
import pytest

from hetero_infer.contracts.hosts import HostPolicy, host_name
from hetero_infer.contracts.options import InvalidOption
from hetero_infer.contracts.server_options import ServerOptions
from hetero_infer.worker.core.engine import LLMEngine

BODY = {"prompt": "hello", "max_tokens": 2}


async def _post(url: str, host: str, origin: str | None = None, auth: str | None = None,
                forwarded_host: str | None = None) -> tuple[int, dict]:
    headers = {"Host": host, "Content-Type": "application/json"}
    if forwarded_host is not None:
        headers["X-Forwarded-Host"] = forwarded_host
    if origin is not None:
        headers["Origin"] = origin
    if auth is not None:
        headers["Authorization"] = f"Bearer {auth}"
    async with aiohttp.ClientSession() as session, session.post(url + "/v1/completions", data=json.dumps(BODY),
                                                                headers=headers) as r:
        return r.status, await r.json(content_type=None)


async def test_a_rebound_name_is_refused_on_loopback(inproc: tuple[str, LLMEngine]) -> None:
    url, engine = inproc
    before = engine.stats().prompt_tokens_total
    status, body = await _post(url, "evil.example:3400", "http://evil.example:3400")  # the page's own origin
    assert status == 403 and body["error"]["code"] == "host_not_allowed", body
    async with aiohttp.ClientSession() as session:  # reads too: /metrics, /v1/models
        for path in ("/v1/models", "/metrics"):
            async with session.get(url + path, headers={"Host": "evil.example"}) as r:
                assert r.status == 403
    assert engine.stats().prompt_tokens_total == before  # nothing ran
    port = url.rsplit(":", 1)[1]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST.", f"app.localhost:{port}", f"[::1]:{port}",
                 "10.0.0.7"):
        status, body = await _post(url, host, f"http://{host}")
        assert status == 200, (host, body)


async def test_x_forwarded_host_is_not_trusted(inproc: tuple[str, LLMEngine]) -> None:
    """Only the Host the request is addressed to counts: X-Forwarded-Host is whatever the sender wrote."""
    url, _ = inproc
    assert (await _post(url, "evil.example:3400", forwarded_host="localhost"))[0] == 403
    assert (await _post(url, "localhost", forwarded_host="evil.example"))[0] == 200


@pytest.mark.parametrize("inproc", [{"allowed_hosts": ["llm.internal", ".corp.example"]}], indirect=True)
async def test_allowed_hosts_add_names(inproc: tuple[str, LLMEngine]) -> None:
    url, _ = inproc
    for host, ok in (("llm.internal:3000", True), ("corp.example", True), ("a.b.corp.example", True),
                     ("xcorp.example", False), ("evil.example", False), ("localhost", True)):
        status, _ = await _post(url, host)
        assert (status == 200) == ok, host


@pytest.mark.parametrize("inproc", [{"api_key": ["k1"]}], indirect=True)
async def test_with_an_api_key_any_name_is_answered(inproc: tuple[str, LLMEngine]) -> None:
    url, _ = inproc
    assert (await _post(url, "evil.example:3400", auth="k1"))[0] == 200
    assert (await _post(url, "evil.example:3400"))[0] == 401  # and the key is what keeps a page out


@pytest.mark.parametrize(("allowed", "bind", "keys", "host", "ok"), [
    ([], "127.0.0.1", False, "evil.example", False),
    ([], "::1", False, "evil.example", False),
    ([], "localhost", False, "evil.example", False),
    ([], "0.0.0.0", False, "my-svc.ns.svc.cluster.local", True),  # containers: reached by names nobody lists
    ([], "127.0.0.1", True, "evil.example", True),
    (["*"], "127.0.0.1", False, "evil.example", True),
    (["llm.internal"], "0.0.0.0", False, "evil.example", False),  # given names are checked wherever it listens
    (["llm.internal"], "0.0.0.0", False, "LLM.internal.:80", True),
    ([], "127.0.0.1", False, None, True),  # HTTP/1.0 without Host: no browser
    ([], "127.0.0.1", False, "[::ffff:127.0.0.1]:80", True),
])
def test_policy(allowed: list[str], bind: str, keys: bool, host: str | None, ok: bool) -> None:
    assert HostPolicy.from_options(allowed, bind, keys).allows(host) is ok


def test_host_name() -> None:
    assert host_name("Example.COM:8080") == "example.com"
    assert host_name("[::1]:3000") == "::1"
    assert host_name("localhost.") == "localhost"
    assert host_name("a:b") == "a:b"  # not a port: left whole (and not a name anyone allows)


@pytest.mark.parametrize("value", ["", "http://x.example", "x.example:80", "x.example/path", "*.example.com", "llm*"])
def test_bad_allowed_hosts(value: str) -> None:
    with pytest.raises(InvalidOption) as exc:
        ServerOptions(allowed_hosts=[value])
    assert exc.value.name == "allowed_hosts"

"""Cross-site policy (issue 15, defect 5), in-process around a real mock-executor engine: CORS off by default,
foreign origins refused before anything runs, JSON bodies only, preflights answered for allowed origins."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from hetero_infer.contracts.options import InvalidOption
from hetero_infer.contracts.server_options import ServerOptions
from hetero_infer.worker.core.engine import LLMEngine

BODY = json.dumps({"prompt": "hello", "max_tokens": 2})
EVIL = "http://evil.example"
APP = "https://app.example"


async def _post(url: str, headers: dict[str, str], body: str = BODY, path: str = "/v1/completions") -> tuple[
        int, dict[str, str], Any]:
    skip = () if "Content-Type" in headers else ("Content-Type",)  # no header at all, not aiohttp's octet-stream
    async with aiohttp.ClientSession() as session, session.post(url + path, data=body.encode(), headers=headers,
                                                                skip_auto_headers=skip) as r:
        return r.status, dict(r.headers), await r.json(content_type=None)


def _generated(engine: LLMEngine) -> int:
    return engine.stats().prompt_tokens_total


async def test_cross_site_text_plain_starts_nothing(inproc: tuple[str, LLMEngine]) -> None:
    """A page on another site can make a browser POST `text/plain` (no preflight) with its Origin: refused."""
    url, engine = inproc
    before = _generated(engine)
    for content_type in ("text/plain", "application/json", "application/x-www-form-urlencoded"):
        status, headers, body = await _post(url, {"Origin": EVIL, "Content-Type": content_type})
        assert status == 403, body
        assert "evil.example" in body["error"]["message"] and "--allowed-origins" in body["error"]["message"]
        assert "Access-Control-Allow-Origin" not in headers
    status, _, _ = await _post(url, {"Origin": "null", "Content-Type": "text/plain"})  # sandboxed frames
    assert status == 403
    assert _generated(engine) == before  # nothing reached the engine


async def test_json_content_type_required(inproc: tuple[str, LLMEngine]) -> None:
    url, engine = inproc
    before = _generated(engine)
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        status, _, body = await _post(url, {"Content-Type": content_type})
        assert status == 415, body
        assert "application/json" in body["error"]["message"]
    status, _, body = await _post(url, {"Content-Type": "text/plain"}, json.dumps({"prompt": "x"}), "/tokenize")
    assert status == 415
    assert _generated(engine) == before
    for headers in ({"Content-Type": "application/json; charset=utf-8"}, {"Content-Type": "application/vnd.x+json"},
                    {}):
        status, _, body = await _post(url, headers)
        assert status == 200, (headers, body)


async def test_cors_off_by_default(inproc: tuple[str, LLMEngine]) -> None:
    url, _ = inproc
    async with aiohttp.ClientSession() as session:
        async with session.options(url + "/v1/completions", headers={
                "Origin": APP, "Access-Control-Request-Method": "POST"}) as r:
            assert r.status == 403
            assert "Access-Control-Allow-Origin" not in r.headers
        async with session.get(url + "/v1/models", headers={"Origin": EVIL}) as r:  # reads: no CORS header
            assert r.status == 200 and "Access-Control-Allow-Origin" not in r.headers
    # The server's own origin is not cross-site.
    host = url.split("://", 1)[1]
    status, _, _ = await _post(url, {"Origin": f"http://{host}", "Content-Type": "application/json"})
    assert status == 200


@pytest.mark.parametrize("inproc", [{"allowed_origins": [APP], "allowed_methods": ["GET", "POST"],
                                     "allowed_headers": ["Content-Type", "Authorization"]}], indirect=True)
async def test_allowed_origin_preflight_and_responses(inproc: tuple[str, LLMEngine]) -> None:
    url, _ = inproc
    async with aiohttp.ClientSession() as session:
        async with session.options(url + "/v1/chat/completions", headers={
                "Origin": APP, "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "content-type, authorization"}) as r:
            assert r.status == 204
            assert r.headers["Access-Control-Allow-Origin"] == APP
            assert "POST" in r.headers["Access-Control-Allow-Methods"]
            assert r.headers["Access-Control-Allow-Headers"].lower() == "content-type, authorization"
            assert "Access-Control-Allow-Credentials" not in r.headers
        for method, wanted in (("DELETE", ""), ("POST", "x-custom")):
            async with session.options(url + "/v1/completions", headers={
                    "Origin": APP, "Access-Control-Request-Method": method,
                    "Access-Control-Request-Headers": wanted}) as r:
                assert r.status == 403
        async with session.options(url + "/v1/completions", headers={
                "Origin": EVIL, "Access-Control-Request-Method": "POST"}) as r:
            assert r.status == 403 and "Access-Control-Allow-Origin" not in r.headers
        stream = {"prompt": "hi", "max_tokens": 3, "stream": True}
        async with session.post(url + "/v1/completions", json=stream, headers={"Origin": APP}) as r:
            assert r.status == 200 and r.headers["Access-Control-Allow-Origin"] == APP
            assert "Origin" in r.headers.get("Vary", "")
            assert "X-Request-Id" in r.headers["Access-Control-Expose-Headers"]
            assert (await r.text()).rstrip().endswith("data: [DONE]")
        async with session.post(url + "/v1/completions", json={"prompt": 5}, headers={"Origin": APP}) as r:
            assert r.status == 400 and r.headers["Access-Control-Allow-Origin"] == APP  # errors are readable
        async with session.post(url + "/v1/completions", json=stream, headers={"Origin": EVIL}) as r:
            assert r.status == 403


@pytest.mark.parametrize("inproc", [{"allowed_origins": ["*"]}], indirect=True)
async def test_any_origin(inproc: tuple[str, LLMEngine]) -> None:
    url, _ = inproc
    status, headers, _ = await _post(url, {"Origin": EVIL, "Content-Type": "application/json"})
    assert status == 200 and headers["Access-Control-Allow-Origin"] == "*"
    status, _, _ = await _post(url, {"Origin": EVIL, "Content-Type": "text/plain"})
    assert status == 415  # JSON bodies only, whatever the origin


@pytest.mark.parametrize(("options", "name"), [
    ({"allowed_origins": ["app.example"]}, "allowed_origins"),
    ({"allowed_origins": [""]}, "allowed_origins"),
    ({"allowed_origins": ["*"], "allow_credentials": True}, "allow_credentials"),
    ({"allowed_methods": [" "]}, "allowed_methods"),
])
def test_bad_cors_options(options: dict[str, Any], name: str) -> None:
    with pytest.raises(InvalidOption) as exc:
        ServerOptions(**options)
    assert exc.value.name == name

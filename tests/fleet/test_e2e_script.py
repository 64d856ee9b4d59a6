"""What e2e/run.sh writes into the cluster, checked here where kind cannot run (tests/operator/test_e2e_and_images.py
checks the script's shape and shellcheck): its InferenceDeployments (with their shell variables expanded as bash
would) pass the CRD schema and the operator's own validation; the operator-mode one keeps what examples/hpa.yaml
sets for its pods; the router example as the script patches it still scales to zero; its stream-load client
passes complete streams from a real worker and fails a cut one; its local Hub serves the model to
`hetero-infer fetch` with the Secret's HF_ENDPOINT and HF_TOKEN only."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from aiohttp import web
from cli_process import CliProcess

from hetero_infer.operator import constants as c
from hetero_infer.operator.spec import parse_spec

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = (ROOT / "e2e" / "run.sh").read_text()
OPERATOR_TESTS = ROOT / "tests" / "operator"
if str(OPERATOR_TESTS) not in sys.path:
    sys.path.insert(0, str(OPERATOR_TESTS))

from crd_validation import validate  # noqa: E402

CRD = yaml.safe_load((ROOT / "crds" / f"{c.CRD_NAME}.yaml").read_text())
GLOBALS = dict(re.findall(r'^([A-Z_]+)="([^"$]*)"$', SCRIPT, re.M))  # NAME="literal" assignments
GLOBALS.update(re.findall(r'^([A-Z_]+)="\$\{\1:-([^}]*)\}"$', SCRIPT, re.M))  # NAME="${NAME:-default}"


def expand(text: str, env: dict[str, str]) -> str:
    """An unquoted heredoc's expansion: ${NAME}, \\$ and \\\\ and backslash-newline, as bash does."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("\\\n", i):
            i += 2
        elif text[i] == "\\" and i + 1 < len(text) and text[i + 1] in "$\\`":
            out.append(text[i + 1])
            i += 2
        elif (m := re.compile(r"\$\{(\w+)\}").match(text, i)) is not None:
            out.append(env[m.group(1)])
            i = m.end()
        else:
            assert not text.startswith("$(", i), f"unescaped command substitution at {text[i:i + 40]!r}"
            out.append(text[i])
            i += 1
    return "".join(out)


def applied(env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Every object the script pipes to `kubectl apply` from a heredoc."""
    docs = re.findall(r"cat <<YAML \| k apply -n \"\$\{APP_NS\}\" -f -\n(.*?)\nYAML\n", SCRIPT, re.S)
    assert docs
    return [yaml.safe_load(expand(d, {**GLOBALS, "name": "x", "seconds": "60", **(env or {})})) for d in docs]


def resource(name: str) -> dict[str, Any]:
    return next(o for o in applied() if o["kind"] == c.KIND and o["metadata"]["name"] == name)


def accepted(obj: dict[str, Any]) -> None:
    assert validate(CRD, obj) == []
    parse_spec(obj["spec"], name=obj["metadata"]["name"])


def test_every_object_it_applies_is_valid() -> None:
    kinds = []
    for obj in applied():
        kinds.append(obj["kind"])
        if obj["kind"] == c.KIND:
            accepted(obj)
        else:
            kubernetes_validate.validate(obj, kubernetes_validate.latest_version(), strict=True)
    assert kinds.count(c.KIND) == 2 and kinds.count("Job") == 2


def test_the_operator_mode_resource_keeps_what_hpa_yaml_sets_for_its_pods() -> None:
    hpa = yaml.safe_load((ROOT / "examples" / "hpa.yaml").read_text())["spec"]
    spec = resource(GLOBALS["INFD_OPERATOR"])["spec"]
    assert spec["autoscaling"]["mode"] == "operator"
    for key in ("resources", "env", "engine", "executor", "model"):
        assert spec[key] == hpa[key], key
    assert "replicas" not in spec  # the autoscaler owns it


def test_the_router_example_as_patched_scales_to_zero_with_slow_mock_steps() -> None:
    example = yaml.safe_load((ROOT / "examples" / "router.yaml").read_text())
    assert example["metadata"]["name"] == GLOBALS["INFD_ROUTER"]
    patch = re.search(r'k patch -n "\$\{APP_NS\}" "infd/\$\{INFD_ROUTER\}" --type merge -p \'(.*?)\'\n', SCRIPT, re.S)
    assert patch is not None

    def merge(target: Any, change: Any) -> Any:  # RFC 7386, as kubectl's --type merge
        if not isinstance(change, dict):
            return change
        out = dict(target) if isinstance(target, dict) else {}
        for k, v in change.items():
            out.pop(k, None) if v is None else out.__setitem__(k, merge(out.get(k), v))
        return out

    patched = merge(example, json.loads(patch.group(1)))
    accepted(patched)
    spec = patched["spec"]
    assert spec["autoscaling"]["minReplicas"] == 0 and spec["router"]["enabled"]
    assert spec["autoscaling"]["scaleToZeroAfterSeconds"] == 30
    assert {"name": "HETERO_INFER_MOCK_STEP_LATENCY_S", "value": "0.05"} in spec["env"]


def test_the_routers_run_the_loaded_operator_image_pinned_across_the_upgrade() -> None:
    """The chart's routerImage defaults to a published image kind cannot pull; the upgrade step changes only the
    operator's tag, so an unchanged router Deployment is what the chart promises, not an accident."""
    install = SCRIPT[SCRIPT.index("h upgrade --install hetero-infer"):]
    install = install[:install.index("--wait")]
    assert '--set routerImage="${OPERATOR_IMAGE_REPO}:${OPERATOR_IMAGE_TAG}"' in install
    upgrade = SCRIPT[SCRIPT.index("h upgrade hetero-infer"):]
    upgrade = upgrade[:upgrade.index("--wait")]
    assert "--reuse-values" in upgrade and "routerImage" not in upgrade and "image.tag=" in upgrade


def test_the_hub_model_resource_fetches_through_its_secret() -> None:
    spec = resource(GLOBALS["INFD_HUB"])["spec"]
    assert spec["model"]["url"] == f"hf://{GLOBALS['HUB_REPO']}" and spec["model"]["credentialsSecret"] == "local-hub"
    assert "--from-literal=HF_ENDPOINT=" in SCRIPT and '--from-literal=HF_TOKEN="${HUB_TOKEN}"' in SCRIPT


# -- the stream-load client -----------------------------------------------------------------------------------

def client_script(url: str, seconds: int) -> str:
    job = next(o for o in applied({"seconds": str(seconds)}) if o["metadata"]["name"] == "e2e-streams-x")
    script = job["spec"]["template"]["spec"]["containers"][0]["args"][0]
    return script.replace(f"http://x.{GLOBALS['APP_NS']}.svc", url)


async def run_client(url: str, seconds: int) -> subprocess.CompletedProcess:
    return await asyncio.to_thread(subprocess.run, ["sh", "-c", client_script(url, seconds)], capture_output=True,
                                   text=True, timeout=120)


@pytest.mark.slow  # a worker process and a few seconds of streams
async def test_the_stream_load_client_passes_complete_streams_and_fails_a_cut_one() -> None:
    # the e2e's client is curl in a shell, as in its Job's image: without curl this fails, not skips
    assert shutil.which("curl") is not None, "the e2e stream client needs curl on PATH"
    worker = await asyncio.to_thread(CliProcess, "serve", "--port", "0", "--executor", "mock", "--no-engine-process",
                                     "--served-model-name", "mock-smollm2", "--mock-step-latency-s", "0.001")
    try:
        await asyncio.to_thread(worker.wait_ready)
        done = await run_client(worker.url, 2)
        assert done.returncode == 0, done.stdout + done.stderr
        assert re.fullmatch(r"[1-9]\d* streams complete\n", done.stdout), done.stdout
    finally:
        worker.stop()

    async def cut(request: web.Request) -> web.StreamResponse:  # 99 of the 100 tokens, then the end
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(99):
            await resp.write(b'data: {"choices":[{"index":0,"text":"x","finish_reason":null}]}\n\n')
        await resp.write(b'data: {"choices":[],"usage":{"completion_tokens":99}}\n\ndata: [DONE]\n\n')
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", cut)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        failed = await run_client(f"http://127.0.0.1:{runner.addresses[0][1]}", 2)
        assert failed.returncode == 1 and "request 0 cut" in failed.stdout, failed.stdout + failed.stderr
    finally:
        await runner.cleanup()


# -- the local Hub ----------------------------------------------------------------------------------------------

@pytest.mark.slow  # builds a tiny model (torch, transformers) and fetches it twice: half a minute or more
def test_the_local_hub_serves_the_model_to_fetch_with_the_secrets_values_only(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    hub = subprocess.Popen([sys.executable, str(ROOT / "e2e" / "local_hub.py"), "--host", "127.0.0.1", "--port",
                            str(port), "--repo", GLOBALS["HUB_REPO"], "--token", GLOBALS["HUB_TOKEN"]],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert hub.stdout is not None
        for line in hub.stdout:
            if "local hub serving" in line:
                break
        else:
            raise AssertionError("the local Hub did not start")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
        env.update(HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT=f"http://127.0.0.1:{port}")
        fetch = [sys.executable, "-m", "hetero_infer.cli", "fetch", f"hf://{GLOBALS['HUB_REPO']}"]
        refused = subprocess.run(fetch, env=env, capture_output=True, text=True, timeout=120)
        assert refused.returncode != 0 and "HF_TOKEN" in refused.stderr + refused.stdout  # private: the token is needed
        got = subprocess.run(fetch, env={**env, "HF_TOKEN": GLOBALS["HUB_TOKEN"]}, capture_output=True, text=True,
                             timeout=120)
        assert got.returncode == 0, got.stdout + got.stderr
        folder = Path(got.stdout.strip().splitlines()[-1])
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in folder.iterdir()}
    finally:
        hub.terminate()
        hub.wait(30)

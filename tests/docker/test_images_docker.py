"""The images of docker/, built from the Dockerfiles as they are and run (`python -m pytest -m docker tests/docker`).

Containers use the host network and are talked to on 127.0.0.1. Rerun whenever docker/ or the package
changes; docs/images.md has the last results.
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from pathlib import Path
from typing import Any

import openai
import pytest
from docker_run import (
    container,
    docker,
    free_port,
    logs,
    metric_families,
    pod_run_options,
    run_python,
    stop,
    wait_ready,
)

from hetero_infer.operator import constants as c
from hetero_infer.operator.manifests import WORKER_UID, Owner, WorkerDefaults, deployment
from hetero_infer.operator.spec import parse_spec

# Builds run in the first test that needs an image (session fixtures): up to ~15 min each on 2 cores.
pytestmark = [pytest.mark.docker, pytest.mark.timeout(3600)]

READY_WITHIN_S = 120  # the bar for the CPU image on the default model
GAUGES = ("hetero_infer_kv_cache_usage_ratio", "hetero_infer_num_requests_running",
          "hetero_infer_num_requests_waiting", "hetero_infer_engine_healthy")


# -- the CPU worker image -----------------------------------------------------------------------------------
def test_cpu_worker_serves_the_default_model_and_drains_on_sigterm(worker_cpu_image: str) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    # The image's CMD, on a free port of the host network; a grace long enough for a busy 2-core machine.
    with container(worker_cpu_image, "serve", "--host", "127.0.0.1", "--port", str(port), "--device", "cpu",
                   "--shutdown-grace", "600") as name:
        seconds = wait_ready(name, base, READY_WITHIN_S)
        print(f"/readyz after {seconds:.1f} s")
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)
        model = client.models.list().data[0].id
        done = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8,
                                         temperature=0)
        assert "Paris" in done.choices[0].text, done.choices[0].text
        # Structured outputs run in the image (xgrammar's CPU mask kernel; the image has no triton).
        schema = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                  "required": ["city"], "additionalProperties": False}
        shaped = client.chat.completions.create(
            model=model, max_tokens=24, temperature=0,
            messages=[{"role": "user", "content": "Which city is the capital of France?"}],
            response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}})
        assert json.loads(shaped.choices[0].message.content or "") in ({"city": "Paris"}, {"city": "Rome"})
        no_triton = run_python(worker_cpu_image, "import importlib.util as u; print(u.find_spec('triton') is None)")
        assert no_triton.stdout.strip() == "True", no_triton

        families = metric_families(base)
        for gauge in GAUGES:
            assert families[gauge].type == "gauge", gauge
        assert families["hetero_infer_engine_healthy"].samples[0].value == 1.0
        assert families["hetero_infer_generation_tokens"].samples[0].value >= 1

        # SIGTERM while a streamed completion runs: it still finishes (drain), then the process exits 0.
        stream = client.completions.create(model=model, prompt="Write a long story about a dragon.",
                                           max_tokens=16, temperature=0, stream=True,
                                           extra_body={"ignore_eos": True})
        chunks = iter(stream)
        first = next(chunks)
        exit_code: list[int] = []
        stopper = threading.Thread(target=lambda: exit_code.append(stop(name)))
        stopper.start()
        rest = list(chunks)
        stopper.join(timeout=660)
        finish = [ch.choices[0].finish_reason for ch in [first, *rest] if ch.choices and ch.choices[0].finish_reason]
        assert finish == ["length"], finish
        assert exit_code == [0], logs(name)[-4000:]
        assert "draining" in logs(name)


def test_cpu_worker_image_user_model_and_prebuilt_kernels(worker_cpu_image: str) -> None:
    config = json.loads(docker("image", "inspect", "--format", "{{json .Config}}", worker_cpu_image).stdout)
    assert config["User"] == f"{WORKER_UID}:{WORKER_UID}"
    # As the image's user: the model is readable, and the CPU kernels load from the image without being
    # compiled again (the root filesystem is read-only: a build could not write its library).
    proc = run_python(worker_cpu_image, """
        import os
        from pathlib import Path
        assert os.getuid() == 10001
        for f in Path(os.environ["HETERO_INFER_MODEL"]).iterdir():
            f.read_bytes()
        from hetero_infer.kernels.cpu import native as cpu_native
        folder = Path(os.environ["HETERO_INFER_CACHE"], "cpu_kernels")
        before = {f.name: f.stat().st_mtime for f in folder.iterdir()}
        assert cpu_native.library() is not None, "the kernels were not prebuilt for this CPU"
        name = os.path.basename(cpu_native.library()._name)
        assert name in before and {f.name: f.stat().st_mtime for f in folder.iterdir()} == before
        print("ok", name)
    """, "--read-only", "--tmpfs", "/tmp:rw,exec,mode=1777")
    assert proc.returncode == 0 and "ok hetero_infer_cpu_" in proc.stdout, proc.stdout + proc.stderr


def test_cpu_worker_runs_the_mock_executor_as_the_operator_deploys_it(worker_cpu_image: str) -> None:
    """The container of the operator's Deployment (command, args, env, user, read-only root, emptyDirs),
    as kind would run it, on a free port of the host network."""
    spec = parse_spec({"model": {"name": "smollm2"}, "executor": "mock", "replicas": 1}, "smol")
    dep = deployment(Owner("smol", "models", "uid-1"), spec, WorkerDefaults(image=worker_cpu_image))
    pod = dep["spec"]["template"]["spec"]
    (worker,) = pod["containers"]
    port = free_port()
    args = list(worker["args"])
    args[args.index("--port") + 1] = str(port)
    args[args.index("--host") + 1] = "127.0.0.1"
    options = pod_run_options(pod, worker)
    base = f"http://127.0.0.1:{port}"
    with container(worker_cpu_image, *args, options=tuple(options)) as name:
        wait_ready(name, base, 300)
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=60)
        done = client.chat.completions.create(model="smollm2", max_tokens=4,
                                              messages=[{"role": "user", "content": "hello"}])
        assert done.choices[0].finish_reason in ("length", "stop") and done.usage.completion_tokens >= 1
        assert "hetero_infer_kv_cache_usage_ratio" in metric_families(base)
        assert stop(name) == 0, logs(name)[-4000:]


def test_cpu_worker_serves_a_model_from_the_local_hub_as_the_operator_deploys_it(worker_cpu_image: str,
                                                                                  tmp_path: Path) -> None:
    """spec.model.url hf://ORG/NAME without a cache, as kind would run the pod: its init container fetches the
    model from a Hub (tests/sources/hub_server.py on the host network, HF_ENDPOINT from spec.env) into the model
    volume, then the worker serves it from there offline, greedy token for token as LLM(...) on the host."""
    import os

    from hub_server import LocalHub, Repo, folder_files
    from quant_testing import save_tiny_model

    from hetero_infer import LLM, SamplingParams

    folder = tmp_path / "tiny"
    save_tiny_model("llama", folder)
    prompt = [1, 17, 256, 4000, 12]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    expected = LLM(str(folder), device="cpu", dtype="float32").generate(
        prompt_token_ids=[prompt], sampling_params=params)[0].outputs[0].text
    hub = LocalHub().start()
    try:
        repo = Repo()
        repo.add_commit({**folder_files(folder), "pytorch_model.bin": b"\0" * 4096})
        hub.repos["org/tiny"] = repo
        spec = parse_spec({"model": {"name": "tiny", "url": "hf://org/tiny"}, "engine": {"dtype": "float32"},
                           "env": [{"name": "HF_ENDPOINT", "value": hub.url}], "replicas": 1}, "tiny")
        pod = deployment(Owner("tiny", "models", "uid-1"), spec, WorkerDefaults(image=worker_cpu_image))["spec"][
            "template"]["spec"]
        (fetch,), (worker,) = pod["initContainers"], pod["containers"]
        model_volume = tmp_path / "model-volume"  # the pod's "model" emptyDir, shared by both containers
        model_volume.mkdir()
        os.chmod(model_volume, 0o777)
        shared = {"model": str(model_volume)}
        init = docker("run", "--rm", "--network", "host", *pod_run_options(pod, fetch, shared=shared),
                      worker_cpu_image, *fetch["command"][1:], timeout=600, check=False)
        assert init.returncode == 0, init.stdout + init.stderr
        assert "downloading hf://org/tiny" in init.stderr and "HTTP Request" not in init.stderr
        assert not any(path.endswith(".bin") for _, path in hub.requests)  # only what the model needs
        port = free_port()
        args = list(worker["args"])
        args[args.index("--port") + 1] = str(port)
        args[args.index("--host") + 1] = "127.0.0.1"
        base = f"http://127.0.0.1:{port}"
        asked = len(hub.requests)
        with container(worker_cpu_image, *args,
                       options=tuple(pod_run_options(pod, worker, shared=shared))) as name:
            wait_ready(name, base, 300)
            client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=60)
            done = client.completions.create(model="tiny", prompt=prompt, max_tokens=8, temperature=0,
                                             extra_body={"ignore_eos": True})
            assert done.choices[0].text == expected
            assert stop(name) == 0, logs(name)[-4000:]
        assert len(hub.requests) == asked  # the worker read the volume offline: it never asked the Hub
    finally:
        hub.stop()


# -- the operator image -------------------------------------------------------------------------------------
async def _docker_async(*args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec("docker", *args, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode()


async def test_operator_image_reconciles_an_inference_deployment(operator_image: str, kmock: Any,
                                                                tmp_path: Path) -> None:
    from kmock_cluster import DEPLOYMENTS, INFD, SERVICES, wait_for

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "kmock", "cluster": {"server": str(kmock.url).rstrip("/")}}],
        "users": [{"name": "kmock", "user": {"token": "kmock-token"}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "kmock"}}],
        "current-context": "kmock",
    }))
    kubeconfig.chmod(0o644)  # the image's user reads it
    health = free_port()
    name = f"hetero-infer-docker-suite-{uuid.uuid4().hex[:8]}"
    # The chart's arguments (charts/hetero-infer/templates/deployment.yaml), liveness on a free port.
    code, out = await _docker_async(
        "run", "-d", "--name", name, "--network", "host", "-v", f"{kubeconfig}:/etc/hetero-infer/kubeconfig:ro",
        "-e", "KUBECONFIG=/etc/hetero-infer/kubeconfig", operator_image,
        "operator", f"--liveness=http://127.0.0.1:{health}/healthz", "--resync-seconds=60", "--standalone")
    assert code == 0, out
    try:
        body = {"apiVersion": c.API_VERSION, "kind": c.KIND, "metadata": {"name": "smol", "namespace": "models"},
                "spec": {"model": {"name": "smollm2"}, "executor": "mock", "replicas": 1}}
        rsp = await kmock.post(f"/apis/{c.API_VERSION}/namespaces/models/{c.PLURAL}", json=body)
        assert rsp.status == 200, await rsp.text()

        def live(resource: Any) -> dict[str, Any] | None:
            key = (resource, "models", "smol")
            return kmock.objects[key].raw if key in kmock.objects and not kmock.objects[key].deleted else None

        dep = await wait_for(lambda: live(DEPLOYMENTS), timeout=120, what="the Deployment")
        assert await wait_for(lambda: live(SERVICES), timeout=60, what="the Service")
        status = await wait_for(lambda: (live(INFD) or {}).get("status", {}).get("observedGeneration") == 1
                                and live(INFD)["status"], timeout=60, what="status.observedGeneration")
        assert status["selector"]
        args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[args.index("--executor") + 1] == "mock"

        code, out = await _docker_async("exec", name, "python", "-c",
                                        f"import urllib.request; print(urllib.request.urlopen("
                                        f"'http://127.0.0.1:{health}/healthz', timeout=5).status)")
        assert code == 0 and out.strip() == "200", out
        code, user = await _docker_async("exec", name, "id", "-u")
        assert user.strip() == "10001"
    except BaseException:
        print((await _docker_async("logs", name))[1][-8000:])
        raise
    finally:
        await _docker_async("rm", "-f", name)


# -- the CUDA image's build steps on a stand-in base ----------------------------------------------------------
def test_cuda_image_build_steps_on_a_standin_base(cuda_standin_image: str) -> None:
    """What can be checked without a GPU: the package (with Triton) imports, the model is readable by the
    runtime user and by an arbitrary one, and gcc plus Python.h build and load a C extension, as Triton's
    launcher does at the first kernel launch."""
    config = json.loads(docker("image", "inspect", "--format", "{{json .Config}}", cuda_standin_image).stdout)
    assert config["User"] == f"{WORKER_UID}:{WORKER_UID}" and config["Cmd"][-1] == "cuda"
    check = """
        import importlib, os, pkgutil, subprocess, sys, sysconfig, tempfile
        from pathlib import Path
        import torch, triton, hetero_infer, hetero_infer.worker, hetero_infer.kernels
        for package in (hetero_infer.worker, hetero_infer.kernels):
            for m in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
                importlib.import_module(m.name)
        assert torch.__version__.split("+")[0] == "2.13.0", torch.__version__
        model = Path(os.environ["HETERO_INFER_MODEL"])
        assert sum(len(f.read_bytes()) for f in model.iterdir()) > 100_000_000
        include = sysconfig.get_paths()["include"]
        assert (Path(include) / "Python.h").is_file(), include
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp, "probe.c")
            src.write_text('#include <Python.h>\\nstatic struct PyModuleDef m = {PyModuleDef_HEAD_INIT, "probe"};\\n'
                           'PyMODINIT_FUNC PyInit_probe(void) { return PyModule_Create(&m); }\\n')
            suffix = sysconfig.get_config_var("EXT_SUFFIX")
            subprocess.run(["gcc", "-shared", "-fPIC", "-O1", f"-I{include}", str(src), "-o",
                            str(Path(tmp, "probe" + suffix))], check=True)
            sys.path.insert(0, tmp)
            import probe
        print("ok", os.getuid())
    """
    for user in ((), ("--user", "4242:4242")):
        proc = run_python(cuda_standin_image, check, *user)
        assert proc.returncode == 0 and proc.stdout.split()[:1] == ["ok"], proc.stdout + proc.stderr
    assert run_python(cuda_standin_image, "import os; print(os.getuid())").stdout.strip() == str(WORKER_UID)


"""spec.model.cache, pure and for real: the claim, the download Job and the cached workers the operator renders (valid
Kubernetes objects), the download's phase from a Job and its pods, and the Job's own command run against a local Hub
(tests/sources/hub_server.py): it fills a cache folder that the workers' --model then names, and the operator reads
the command's real progress lines and refusals (NotFound, Unauthorized, CannotSplit) from what it logs."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from hetero_infer.operator import constants as c
from hetero_infer.operator.diff import strip_none
from hetero_infer.operator.manifests import (
    Owner,
    WorkerDefaults,
    cache_claim,
    cache_key,
    children,
    download_job,
    fetch_job_name,
    fetch_source,
)
from hetero_infer.operator.model_state import (
    CANNOT_SPLIT,
    DOWNLOAD_FAILED,
    DOWNLOADING,
    FAILED,
    NO_SPACE,
    NOT_FOUND,
    PENDING,
    READY,
    UNAUTHORIZED,
    download_progress,
    error_line,
    failure_reason,
    model_state,
    transition_event,
)
from hetero_infer.operator.spec import parse_spec

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "sources"))
OWNER = Owner("llama-8b", "models", "uid-1")
K8S_VERSIONS = ["1.30.0", kubernetes_validate.latest_version()]
URL = "hf://org/tiny"


def example(name: str) -> dict[str, Any]:
    return next(d for d in yaml.safe_load_all((ROOT / "examples" / name).read_text()) if d["kind"] == c.KIND)


def spec_with(**model: Any) -> Any:
    return parse_spec({"model": {"name": "tiny", "url": URL, **model}, "replicas": 2}, "llama-8b")


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("name", ["hub-cache.yaml", "s3.yaml"])
def test_the_cache_examples_render_valid_objects(name: str, version: str) -> None:
    spec = parse_spec(example(name)["spec"], "llama-8b")
    claim = cache_claim(OWNER, spec)
    claim_name = claim["metadata"]["name"] if claim else spec.model.cache.claim_name
    key = cache_key(spec.model.url)
    job = download_job(OWNER, spec, WorkerDefaults(), claim_name)
    workers = children(OWNER, spec, cached=key).deployment
    for obj in [job, workers] + ([claim] if claim else []):
        kubernetes_validate.validate(strip_none(obj), version, strict=True)
    assert (claim is None) == (name == "s3.yaml")  # an existing claim is never created


def test_no_worker_deployment_before_the_model_is_in_the_cache() -> None:
    spec = spec_with(cache={"size": "50Gi"})
    assert children(OWNER, spec).deployment is None
    assert [m["kind"] for m in children(OWNER, spec).all()] == ["Service", "PodDisruptionBudget"]
    dep = children(OWNER, spec, cached=cache_key(URL)).deployment
    assert dep["metadata"]["annotations"][c.MODEL_CACHE_KEY_ANNOTATION] == cache_key(URL)


def test_cache_folders_and_jobs_are_keyed_by_source_and_revision() -> None:
    urls = [URL, URL + "@v2", URL + "@main", "hf://org/tiny2", "s3://models/org/tiny"]
    keys = [cache_key(u) for u in urls]
    assert len(set(keys)) == len(keys) and all("/" not in k and len(k) <= 91 for k in keys)
    assert cache_key(URL + "@v2").startswith("hf-org-tiny-v2-")
    names = {fetch_job_name(Owner("x" * 63, "ns", "u"), k) for k in keys}
    assert len(names) == len(keys) and all(len(n) <= 63 for n in names)


def test_the_job_alone_holds_the_credentials_and_the_claim_is_read_only_for_workers() -> None:
    spec = spec_with(credentialsSecret="hf-token", cache={"claimName": "shared"})
    job = download_job(OWNER, spec, WorkerDefaults(), "shared")
    (fetch,) = job["spec"]["template"]["spec"]["containers"]
    assert fetch["envFrom"] == [{"secretRef": {"name": "hf-token"}}]
    assert "ephemeral-storage" not in fetch["resources"]["requests"]  # it writes to the claim, not the node
    pod = children(OWNER, spec, cached=cache_key(URL)).deployment["spec"]["template"]["spec"]
    (worker,) = pod["containers"]
    assert worker["envFrom"] is None and pod["initContainers"] is None
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "shared", "readOnly": True}} in pod["volumes"]
    assert "ephemeral-storage" not in worker["resources"]["requests"]


# -- the phase from a Job and its pods -----------------------------------------------------------------------


def job(**status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "j"}, "status": status}


def pod(phase: str, created: str = "2026-01-01T00:00:00Z", **state: Any) -> dict[str, Any]:
    return {"metadata": {"creationTimestamp": created}, "status": {
        "phase": phase, "containerStatuses": [{"state": state}] if state else []}}


LOG_404 = "2026-11-27 03:00:00,000 ERROR hetero_infer.model_source: hf://org/x: repository not found (HTTP 404)\n"


@pytest.mark.parametrize(("line", "reason"), [
    ("hf://org/x: repository not found (HTTP 404)", NOT_FOUND),
    ("hf://org/x: repository not found or not authorized (HTTP 401): check the name, and set HF_TOKEN", UNAUTHORIZED),
    ("hf://org/x: access denied (HTTP 403): a gated repository; accept its terms", UNAUTHORIZED),
    ("hf://org/x: revision 'v9' not found", NOT_FOUND),
    ("s3://models/x: bucket 'models' not found", NOT_FOUND),
    ("s3://models/x: no objects under this prefix", NOT_FOUND),
    ("s3://models/x: access denied (InvalidAccessKeyId): check the AWS credentials", UNAUTHORIZED),
    ("s3://models/x: no AWS credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a profile)", UNAUTHORIZED),
    ("hf://org/x: download failed: OSError: [Errno 28] No space left on device", NO_SPACE),
    ("hf://org/x: cannot reach https://huggingface.co (ConnectError), and it is not in the cache /models", DOWNLOAD_FAILED),
    ("cannot split org/x 3 ways: num_attention_heads=16 is not divisible by 3", CANNOT_SPLIT),
    ("cannot split x 4 ways: num_key_value_heads=3 neither divides by 4 nor divides it (to replicate)", CANNOT_SPLIT),
    ("hf://org/x: cannot split (not found)", NOT_FOUND),  # only fetch's split line is CannotSplit
])
def test_failures_are_classified_by_their_line(line: str, reason: str) -> None:
    assert failure_reason(line) == reason


def test_phases_from_the_job_and_its_pods() -> None:
    assert model_state(URL, None).phase == PENDING
    assert "does not exist" in model_state(URL, None, claim_missing="shared").message
    assert model_state(URL, job(active=1), [pod("Pending", waiting={"reason": "ErrImagePull", "message": "no"})]) \
        .message.endswith("ErrImagePull: no")
    running = model_state(URL, job(active=1), [pod("Running", running={})],
                          "x INFO hetero_infer.progress: hf://org/tiny: 8.0 GB of 16.1 GB (50%), 100.0 MB/s, 80 s\n")
    assert (running.phase, running.message) == (DOWNLOADING, "downloading hf://org/tiny: 8.0 GB of 16.1 GB (50%), "
                                                             "100.0 MB/s")
    failed_pod = pod("Failed", terminated={"exitCode": 1, "message": LOG_404})
    backing_off = model_state(URL, job(failed=1), [failed_pod])
    assert backing_off.phase == PENDING and "after 1 failed attempt(s): hf://org/x: repository not found" in \
        backing_off.message
    retrying = model_state(URL, job(active=1, failed=1), [failed_pod, pod("Running", "2026-01-01T00:01:00Z",
                                                                          running={})])
    assert retrying.phase == DOWNLOADING and "after 1 failed attempt(s)" in retrying.message
    failed = model_state(URL, job(failed=7, conditions=[{"type": "Failed", "status": "True",
                                                         "reason": "BackoffLimitExceeded"}]), [failed_pod])
    assert (failed.phase, failed.reason) == (FAILED, NOT_FOUND) and failed.message.startswith("hf://org/x: repository")
    evicted = pod("Failed")
    evicted["status"].update(reason="Evicted", message="Pod ephemeral local storage usage exceeds the total limit")
    assert model_state(URL, job(failed=1, conditions=[{"type": "Failed", "status": "True"}]), [evicted]).reason \
        == NO_SPACE
    done = model_state(URL, job(succeeded=1, conditions=[{"type": "Complete", "status": "True"}]))
    assert (done.phase, done.ready) == (READY, True)


def test_one_event_per_transition() -> None:
    state = model_state(URL, job(active=1), [pod("Running", running={})])
    assert transition_event(None, None, URL, state) == ("Normal", "ModelDownloading", "downloading hf://org/tiny")
    written = {"url": URL, "phase": DOWNLOADING}
    assert transition_event(written, {"reason": DOWNLOADING}, URL, state) is None  # progress alone is no event
    assert transition_event(written, {"reason": DOWNLOADING}, URL + "@v2", state) is not None  # another revision
    failed = model_state(URL, job(failed=7, conditions=[{"type": "Failed", "status": "True"}]),
                         [pod("Failed", terminated={"message": LOG_404})])
    etype, reason, message = transition_event(written, {"reason": DOWNLOADING}, URL, failed)
    assert (etype, reason) == ("Warning", "ModelFailed") and message.startswith("NotFound: hf://org/x")


# -- the Job's command, for real ------------------------------------------------------------------------------


@pytest.fixture
def hub():
    from hub_server import LocalHub

    server = LocalHub().start()
    yield server
    server.stop()


def run_job_command(job: dict[str, Any], cache: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The download Job's container as the kubelet would run it, with the claim mounted at `cache` (its /models)."""
    (container,) = job["spec"]["template"]["spec"]["containers"]
    here = {e["name"]: e["value"].replace("/models", str(cache)) for e in container["env"]}
    args = [a.replace("/models", str(cache)) for a in container["command"][1:]]
    base = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HETERO_INFER"))}
    return subprocess.run([sys.executable, "-m", "hetero_infer.cli", *args, "--progress-interval", "0.001"],
                          env={**base, **here, **env, "HOME": str(cache.parent)}, capture_output=True, text=True,
                          timeout=120)


def test_the_download_job_fills_the_folder_the_workers_serve(hub, tmp_path: Path) -> None:
    from hub_server import Repo

    rng = random.Random(3)
    files = {"config.json": b'{"model_type": "llama"}', "tokenizer.json": b"{}",
             "model.safetensors": rng.randbytes(2_000_000), "model.Q4_0.gguf": b"\0" * 1000}
    repo = Repo()
    repo.add_commit(files)
    hub.repos["org/tiny"] = repo
    spec = spec_with(cache={"claimName": "shared"})
    job = download_job(OWNER, spec, WorkerDefaults(), "shared")
    cache = tmp_path / "claim"
    done = run_job_command(job, cache, {"HF_ENDPOINT": hub.url})
    assert done.returncode == 0, done.stderr

    # The workers' --model, on the claim as mounted here: the fetched files, nothing else.
    dep = children(OWNER, spec, cached=cache_key(URL)).deployment
    worker = dep["spec"]["template"]["spec"]["containers"][0]
    args = worker["args"]
    (mount,) = [m for m in worker["volumeMounts"] if m["name"] == "model"]  # the model's folder only (subPath)
    root = cache / mount["subPath"]
    served = Path(args[args.index("--model") + 1].replace(mount["mountPath"], str(root), 1))
    assert served.resolve().is_relative_to(root.resolve())  # the link never leaves the mounted folder
    assert sorted(os.listdir(served)) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert (served / "model.safetensors").read_bytes() == files["model.safetensors"]
    assert not os.path.isabs(os.readlink(served))  # valid wherever the claim is mounted

    # What the operator reads in the running pod's log: the command's own progress lines.
    progress = download_progress(done.stderr)
    assert progress is not None and " of 2.0 MB (" in progress, done.stderr

    # Its refusals, as the failed pod's termination message carries them.
    missing_job = download_job(OWNER, spec_with(url="hf://org/missing", cache={"claimName": "s"}), WorkerDefaults(), "s")
    missing = run_job_command(missing_job, cache, {"HF_ENDPOINT": hub.url, "HF_TOKEN": hub.token})
    assert failure_reason(error_line(missing.stderr)) == NOT_FOUND, missing.stderr
    # ... with a status the Job's podFailurePolicy fails the Job on at once, instead of ~10 minutes of retries
    assert fails_the_job_at_once(missing_job, missing.returncode), missing.returncode
    # Without a token the Hub answers 401 for a repository it does not have (it tells no one which private ones
    # exist): a token is what to try first.
    anonymous = run_job_command(missing_job, cache, {"HF_ENDPOINT": hub.url})
    assert "not found or not authorized (HTTP 401)" in error_line(anonymous.stderr)
    assert fails_the_job_at_once(missing_job, anonymous.returncode)
    assert failure_reason(error_line(anonymous.stderr)) == UNAUTHORIZED
    private = Repo(private=True)
    private.add_commit(files)
    hub.repos["org/private"] = private
    refused = run_job_command(download_job(OWNER, spec_with(url="hf://org/private", cache={"claimName": "s"}),
                                           WorkerDefaults(), "s"), cache, {"HF_ENDPOINT": hub.url, "HF_TOKEN": "hf_wrong"})
    line = error_line(refused.stderr)
    assert failure_reason(line) == UNAUTHORIZED and "hf_wrong" not in refused.stderr
    assert fails_the_job_at_once(missing_job, refused.returncode)
    # An unreachable Hub is worth a retry: that status is counted against backoffLimit instead.
    unreachable = run_job_command(missing_job, cache, {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_ETAG_TIMEOUT": "2"})
    assert unreachable.returncode == 1 and not fails_the_job_at_once(missing_job, unreachable.returncode), \
        unreachable.stderr


def fails_the_job_at_once(job: dict, exit_code: int) -> bool:
    """Kubernetes' podFailurePolicy onExitCodes rule, as the Job controller applies it to the fetch container."""
    (container,) = job["spec"]["template"]["spec"]["containers"]
    for rule in job["spec"]["podFailurePolicy"]["rules"]:
        codes = rule.get("onExitCodes")
        if codes and codes.get("containerName") in (None, container["name"]) and exit_code != 0:
            hit = exit_code in codes["values"]
            if hit == (codes["operator"] == "In"):
                return rule["action"] == "FailJob"
    return False


def test_the_job_refuses_a_model_its_gpus_cannot_split(hub, tmp_path: Path) -> None:
    """resources.gpus: 3 on a model of 16 heads: the rendered Job's command fails at once (podFailurePolicy) with
    the line ModelReady reports as CannotSplit; gpus: 2 fills the folder."""
    from hub_server import Repo

    config = {"model_type": "llama", "num_attention_heads": 16, "num_key_value_heads": 4, "hidden_size": 64,
              "intermediate_size": 128}
    repo = Repo()
    repo.add_commit({"config.json": json.dumps(config).encode(), "tokenizer.json": b"{}",
                     "model.safetensors": b"\0" * 1000})
    hub.repos["org/tiny"] = repo
    cache = tmp_path / "claim"

    def job(gpus: int) -> dict[str, Any]:
        spec = parse_spec({"model": {"name": "tiny", "url": URL, "cache": {"size": "1Gi"}},
                           "resources": {"gpus": gpus}}, "llama-8b")
        return download_job(OWNER, spec, WorkerDefaults(), "llama-8b-model-cache")

    refused = run_job_command(job(3), cache, {"HF_ENDPOINT": hub.url})
    line = error_line(refused.stderr)
    assert line.startswith("cannot split org/tiny 3 ways: num_attention_heads=16 is not divisible by 3"), refused.stderr
    assert failure_reason(line) == CANNOT_SPLIT and fails_the_job_at_once(job(3), refused.returncode)
    state = model_state(URL, {"metadata": {"name": "j"}, "status": {"failed": 1, "conditions": [
        {"type": "Failed", "status": "True", "reason": "PodFailurePolicy"}]}},
        [pod("Failed", terminated={"exitCode": refused.returncode, "message": refused.stderr[-2000:]})])
    assert (state.phase, state.reason) == (FAILED, CANNOT_SPLIT) and state.message.startswith(line)
    done = run_job_command(job(2), cache, {"HF_ENDPOINT": hub.url})
    assert done.returncode == 0, done.stderr


# -- a GGUF converted once into the cache ---------------------------------------------------------------------


@pytest.mark.parametrize(("gpus", "dtype"), [(1, "bfloat16"), (0, "float32")])
def test_a_gguf_on_a_claim_is_converted_once_by_the_job(gpus: int, dtype: str) -> None:
    raw = {"model": {"name": "m", "pvc": {"claimName": "weights", "subPath": "gguf/m.Q4_0.gguf"},
                     "cache": {"size": "20Gi"}}, "resources": {"gpus": gpus}}
    spec = parse_spec(raw, "llama-8b")
    key = cache_key(fetch_source(spec, WorkerDefaults()).name)
    job = download_job(OWNER, spec, WorkerDefaults(), "llama-8b-model-cache")
    kubernetes_validate.validate(strip_none(job), K8S_VERSIONS[-1], strict=True)
    (fetch,) = job["spec"]["template"]["spec"]["containers"]
    assert fetch["command"] == ["hetero-infer", "fetch", "/source/gguf/m.Q4_0.gguf", "--link", f"/models/{key}/model",
                                "--gguf-dtype", dtype]
    assert {"name": "source", "persistentVolumeClaim": {"claimName": "weights", "readOnly": True}} in \
        job["spec"]["template"]["spec"]["volumes"]
    assert {"name": "source", "mountPath": "/source", "readOnly": True} in fetch["volumeMounts"]
    memory = "24Gi" if gpus else "4Gi"  # the worker's: the conversion holds the whole model, as the worker does
    assert fetch["resources"] == {"requests": {"cpu": "1", "memory": memory}, "limits": {"memory": memory}}
    pod = children(OWNER, spec, cached=key).deployment["spec"]["template"]["spec"]
    claims = [v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v]
    assert claims == ["llama-8b-model-cache"]  # the workers read the converted folder, not the GGUF's claim
    args = pod["containers"][0]["args"]
    assert args[args.index("--model") + 1] == f"/models/{key}/model"
    other = parse_spec({**raw, "resources": {"gpus": 1 - gpus}}, "llama-8b")
    assert cache_key(fetch_source(other, WorkerDefaults()).name) != key  # each dtype is its own folder


@pytest.mark.slow
def test_the_job_converts_a_gguf_once_into_bfloat16(tmp_path: Path) -> None:
    """The Job's command for a GPU target on the default model's GGUF (about two minutes: a real conversion)."""
    from safetensors import safe_open

    from hetero_infer.worker.runner.loader import default_model_gguf

    spec = parse_spec({"model": {"name": "m", "path": str(default_model_gguf()), "cache": {"size": "2Gi"}},
                       "resources": {"gpus": 1}}, "smol")
    job = download_job(OWNER, spec, WorkerDefaults(), "c")
    cache = tmp_path / "claim"
    done = run_job_command(job, cache, {})
    assert done.returncode == 0, done.stderr[-2000:]
    key = cache_key(fetch_source(spec, WorkerDefaults()).name)
    served = cache / key / "model"
    assert (served / "config.json").is_file() and (served / ".complete").is_file()
    with safe_open(str(served / "model.safetensors"), framework="pt") as f:
        name = next(iter(f.keys()))
        assert f.get_slice(name).get_dtype() == "BF16"
    again = run_job_command(job, cache, {})  # a second run (a retried Job) finds the conversion
    assert again.returncode == 0 and "converting" not in again.stderr

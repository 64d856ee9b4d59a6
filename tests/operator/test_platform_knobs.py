"""What a platform team sets on day one (issue 44): the GPU's device-plugin resource, where and as whom the download
Job runs; each knob rendered where it belongs and accepted by the Kubernetes schemas (strict)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from hetero_infer.operator import constants as c
from hetero_infer.operator.diff import strip_none
from hetero_infer.operator.manifests import Owner, children
from hetero_infer.operator.manifests.cache import download_job
from hetero_infer.operator.manifests.common import WorkerDefaults
from hetero_infer.operator.spec import parse_spec

OWNER = Owner("smol", "models", "uid-1")
K8S_VERSIONS = ["1.30.0", kubernetes_validate.latest_version()]
ROOT = Path(__file__).resolve().parents[2]


def worker_pod(**raw: Any) -> dict[str, Any]:
    dep = children(OWNER, parse_spec({"model": {"name": "smol"}, **raw}, "smol")).deployment
    return dep["spec"]["template"]["spec"]


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize(("resource", "taints"), [
    ("nvidia.com/gpu", ["nvidia.com/gpu"]),
    ("amd.com/gpu", ["amd.com/gpu"]),
    ("nvidia.com/mig-1g.10gb", ["nvidia.com/mig-1g.10gb", "nvidia.com/gpu"]),  # a MIG node is tainted nvidia.com/gpu
    ("gpu.intel.com/i915", ["gpu.intel.com/i915"]),
])
def test_the_gpu_is_asked_for_as_the_device_plugins_resource(resource: str, taints: list[str], version: str) -> None:
    pod = worker_pod(resources={"gpus": 1, "gpuResource": resource})
    (worker,) = pod["containers"]
    assert worker["resources"]["requests"][resource] == "1" and worker["resources"]["limits"][resource] == "1"
    assert not {"nvidia.com/gpu"} & (set(worker["resources"]["limits"]) - {resource})
    assert [t["key"] for t in pod["tolerations"]] == taints
    assert "--device" in worker["args"] and worker["args"][worker["args"].index("--device") + 1] == "cuda"
    dep = children(OWNER, parse_spec({"model": {"name": "smol"}, "resources": {"gpus": 1, "gpuResource": resource}},
                                     "smol")).deployment
    kubernetes_validate.validate(strip_none(dep), version, strict=True)


def test_a_cpu_worker_asks_for_no_device() -> None:
    pod = worker_pod(resources={"gpuResource": "amd.com/gpu"})
    assert "amd.com/gpu" not in pod["containers"][0]["resources"]["limits"] and pod.get("tolerations") is None


def test_the_download_job_of_gpu_workers_runs_the_cpu_image() -> None:
    """A download needs no CUDA: a GPU model's Job runs the operator's CPU worker image, unless download.image says
    otherwise, or the model is a .gguf inside the worker's image (only that image has the file)."""
    defaults = WorkerDefaults(image="cpu:1", gpu_image="cuda:1")
    model = {"name": "m", "url": "hf://o/n", "cache": {"size": "5Gi"}}

    def image(**raw: Any) -> str:
        spec = parse_spec({"model": model, "resources": {"gpus": 1}, **raw}, "smol")
        return download_job(OWNER, spec, defaults, "c")["spec"]["template"]["spec"]["containers"][0]["image"]

    assert image() == "cpu:1"
    assert image(image="mine-cuda:2") == "cpu:1"
    model["cache"]["download"] = {"image": "fetch:3"}
    assert image() == "fetch:3"
    model.update(url=None, path="/models/m.Q4_K_M.gguf", cache={"size": "5Gi"})
    assert image() == "cuda:1"


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_platform_example_renders_valid_objects(version: str) -> None:
    docs = list(yaml.safe_load_all((ROOT / "examples" / "platform.yaml").read_text()))
    (obj,) = [d for d in docs if d["kind"] == c.KIND]
    spec = parse_spec(obj["spec"], obj["metadata"]["name"])
    owner = Owner(obj["metadata"]["name"], "models", "uid-1")
    job = download_job(owner, spec, WorkerDefaults(), "shared-models")
    for manifest in [job, *children(owner, spec, cached="k").all()]:
        kubernetes_validate.validate(strip_none(manifest), version, strict=True)
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] and pod["nodeSelector"] and job["spec"]["podFailurePolicy"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert any(env.get("AWS_CA_BUNDLE", "").startswith(m) for m in mounts)  # the CA bundle is really there

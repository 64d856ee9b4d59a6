"""`resources.gpus: N` > 1: the worker splits the model over its N GPUs (`--tensor-parallel-size N`), with a
memory-backed /dev/shm of 1Gi per GPU and room in the pod's memory for the N-1 rank processes; valid Kubernetes
objects. Refused with a clear message at apply time: the mock executor (no model to split), the flag in extraArgs
(the operator renders it), a replica on several nodes (reserved) -- in parse_spec and, through the real operator
against KMock, as an InvalidSpec status."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
from kmock_cluster import DEPLOYMENTS, INFD, wait_for
from test_operator_kmock import create, infd, live

from hetero_infer.operator.diff import parse_quantity, strip_none
from hetero_infer.operator.manifests import Owner, children
from hetero_infer.operator.spec import SpecError, parse_spec

OWNER = Owner("big", "models", "uid-1")


def _deployment(**raw: Any) -> dict[str, Any]:
    return children(OWNER, parse_spec({"model": {"name": "big", "path": "/models/big"}, **raw}, "big")).deployment


def _flag(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


@pytest.mark.parametrize("gpus, tp, shm, memory_gib", [(0, None, "1Gi", 4), (1, None, "1Gi", 24), (2, "2", "2Gi", 33),
                                                        (8, "8", "8Gi", 87)])
def test_gpus_render_the_tensor_parallel_size_shm_and_memory(gpus: int, tp: str | None, shm: str,
                                                             memory_gib: int) -> None:
    dep = _deployment(resources={"gpus": gpus})
    pod = dep["spec"]["template"]["spec"]
    (worker,) = pod["containers"]
    assert _flag(worker["args"], "--tensor-parallel-size") == tp
    (dshm,) = [v for v in pod["volumes"] if v["name"] == "dshm"]
    assert dshm["emptyDir"] == {"medium": "Memory", "sizeLimit": shm}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in worker["volumeMounts"]
    memory = worker["resources"]["limits"]["memory"]
    assert parse_quantity(memory) == memory_gib * 2**30, memory
    if gpus:
        assert worker["resources"]["limits"]["nvidia.com/gpu"] == str(gpus)
    kubernetes_validate.validate(strip_none(dep), kubernetes_validate.latest_version(), strict=True)


def test_shm_size_given_wins_over_the_per_gpu_default() -> None:
    pod = _deployment(resources={"gpus": 4}, shmSize="16Gi")["spec"]["template"]["spec"]
    (dshm,) = [v for v in pod["volumes"] if v["name"] == "dshm"]
    assert dshm["emptyDir"]["sizeLimit"] == "16Gi"


@pytest.mark.parametrize("raw, needle", [
    ({"executor": "mock", "resources": {"gpus": 2}},
     "spec.resources.gpus: 2 GPUs split the model over them (tensor parallelism), but the mock executor runs no "
     "model"),
    ({"resources": {"gpus": 2}, "engine": {"extraArgs": ["--tensor-parallel-size", "2"]}},
     "--tensor-parallel-size is set by the operator (spec.resources.gpus)"),
    ({"resources": {"gpus": 2, "nodes": 2}}, "spec.resources.nodes"),
    ({"resources": {"gpus": 9}}, "spec.resources.gpus"),
    ({"resources": {"gpus": 2}, "adapters": []}, "LoRA adapters do not run under tensor parallelism yet"),
])
def test_what_cannot_be_split_is_refused_with_its_reason(raw: dict, needle: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec({"model": {"name": "big"}, **raw}, "big")
    assert needle in str(err.value)


async def test_the_operator_refuses_a_mock_spec_with_several_gpus(kmock: Any, operator: Any) -> None:
    await operator()
    await create(kmock, infd(resources={"gpus": 2}))  # infd's executor is the mock
    status = await wait_for(lambda: live(kmock, INFD).get("status", {}).get("conditions") and
                            live(kmock, INFD)["status"], what="degraded status")
    degraded = next(cond for cond in status["conditions"] if cond["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "InvalidSpec"
    assert "tensor parallelism" in degraded["message"]
    assert live(kmock, DEPLOYMENTS) is None


@pytest.mark.parametrize("gpus, check", [(1, []), (3, ["--tensor-parallel-size", "3"])])
def test_the_download_checks_the_split_before_any_worker_starts(gpus: int, check: list[str]) -> None:
    """fetch --tensor-parallel-size N in the init container (no cache) and in the download Job of the operator's
    own cache claim; a shared claim's Job (deployments of any gpus wait on it) leaves it to the workers."""
    from hetero_infer.operator.manifests.cache import download_job
    from hetero_infer.operator.manifests.common import WorkerDefaults

    model = {"name": "big", "url": "hf://org/big"}
    spec = parse_spec({"model": model, "resources": {"gpus": gpus}}, "big")
    dep = children(OWNER, spec).deployment
    (fetch,) = dep["spec"]["template"]["spec"]["initContainers"]
    assert fetch["command"] == ["hetero-infer", "fetch", "hf://org/big", *check]
    kubernetes_validate.validate(strip_none(dep), kubernetes_validate.latest_version(), strict=True)
    own = parse_spec({"model": {**model, "cache": {"size": "50Gi"}}, "resources": {"gpus": gpus}}, "big")
    job = download_job(OWNER, own, WorkerDefaults(), "big-model-cache")
    (fetch,) = job["spec"]["template"]["spec"]["containers"]
    assert fetch["command"][3:] == ["--link", fetch["command"][4], *check]
    kubernetes_validate.validate(strip_none(job), kubernetes_validate.latest_version(), strict=True)
    shared = parse_spec({"model": {**model, "cache": {"claimName": "models"}}, "resources": {"gpus": gpus}}, "big")
    (fetch,) = download_job(OWNER, shared, WorkerDefaults(), "models")["spec"]["template"]["spec"]["containers"]
    assert "--tensor-parallel-size" not in fetch["command"]

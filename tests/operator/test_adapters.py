"""spec.adapters as pure functions: parsed and refused as the CRD does, rendered into the workers' flags (read back
by `hetero-infer serve`'s own parser), a pod template that adding or removing an adapter leaves unchanged (no
rollout), the ConfigMap the workers follow, the adapters' download Jobs, and every child valid for Kubernetes."""

from __future__ import annotations

import json
from typing import Any

import kubernetes_validate
import pytest
from crd_validation import validate

from hetero_infer.operator import constants as c
from hetero_infer.operator.diff import strip_none
from hetero_infer.operator.manifests import Owner, WorkerDefaults, children, download_job, worker_args
from hetero_infer.operator.manifests.adapters import adapter_path, adapters_config_map
from hetero_infer.operator.manifests.cache import adapter_source
from hetero_infer.operator.model_state import READY, ModelState
from hetero_infer.operator.spec import SpecError, parse_spec
from hetero_infer.operator.status import Observed, compute_status

OWNER = Owner("qwen", "models", "uid-1")
CACHE = {"name": "qwen3", "url": "hf://Qwen/Qwen3-0.6B", "cache": {"size": "20Gi"}}
SQL = {"name": "sql", "url": "hf://org/sql-lora"}
CHAT = {"name": "chat", "url": "s3://adapters/chat"}


def spec_of(**spec: Any) -> Any:
    return parse_spec({"model": CACHE, **spec}, "qwen")


def template(spec: Any) -> dict[str, Any]:
    deployment = children(OWNER, spec, None, "KEY").deployment
    assert deployment is not None
    return deployment["spec"]["template"]


def test_adding_and_removing_adapters_leaves_the_pod_template_as_it_is():
    empty = template(spec_of(adapters=[]))
    assert template(spec_of(adapters=[SQL])) == empty == template(spec_of(adapters=[SQL, CHAT]))
    assert template(spec_of()) != empty  # giving the field turns LoRA on: the one change of the pods


def test_the_worker_flags_read_back_with_lora_on():
    from hetero_infer.worker.server.cli import build_parser, resolve_options

    spec = spec_of(adapters=[SQL], engine={"maxLoras": 3, "maxLoraRank": 32, "maxCpuLoras": 6})
    server, config = resolve_options(build_parser().parse_args(worker_args(spec, "KEY")[1:]), environ={})
    assert (config.enable_lora, config.max_loras, config.max_lora_rank, config.max_cpu_loras) == (True, 3, 32, 6)
    assert server.lora_modules_file == f"{c.ADAPTERS_CONFIG_DIR}/{c.ADAPTERS_KEY}" and not server.lora_modules
    off = spec_of()
    server, config = resolve_options(build_parser().parse_args(worker_args(off, "KEY")[1:]), environ={})
    assert not config.enable_lora and server.lora_modules_file is None


def test_the_workers_mount_the_list_and_the_whole_cache():
    pod = template(spec_of(adapters=[SQL]))["spec"]
    (worker,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["lora-adapters"]["configMap"] == {"name": "qwen-adapters", "optional": True}
    assert {"name": "lora-adapters", "mountPath": c.ADAPTERS_CONFIG_DIR, "readOnly": True} in worker["volumeMounts"]
    assert {"name": "model", "mountPath": c.ADAPTERS_MOUNT, "readOnly": True} in worker["volumeMounts"]


def test_the_config_map_lists_the_ready_adapters_where_the_workers_read_them():
    spec = parse_spec({"model": {**CACHE, "cache": {"claimName": "shared"}}, "adapters": [
        SQL, CHAT, {"name": "local", "url": "pvc://shared/team/local-lora"}]}, "qwen")
    cm = adapters_config_map(OWNER, spec, ["sql", "local"])
    listing = json.loads(cm["data"][c.ADAPTERS_KEY])
    assert [a["name"] for a in listing] == ["sql", "local"]  # chat is not downloaded yet
    assert listing[1]["path"] == f"{c.ADAPTERS_MOUNT}/team/local-lora"
    key = download_job(OWNER, spec, WorkerDefaults(), "shared", adapter_source(spec.adapters[0]))["metadata"][
        "annotations"][c.MODEL_CACHE_KEY_ANNOTATION]
    assert listing[0]["path"] == f"{c.ADAPTERS_MOUNT}/{key}/model"  # where its Job links it (fetch --link)
    on_model = parse_spec({"model": {"name": "m", "pvc": {"claimName": "weights"}},
                           "adapters": [{"name": "a", "url": "pvc://weights/loras/a"}]}, "qwen")
    assert adapter_path(on_model, on_model.adapters[0]) == "/models/loras/a"
    assert adapters_config_map(OWNER, spec_of(), []) is None


def test_the_workers_read_the_config_map_as_the_operator_writes_it(tmp_path):
    """The ConfigMap's file is what the worker's --lora-modules-file reads (hetero_infer/contracts/lora_modules.py)."""
    from hetero_infer.contracts.lora_modules import LoRAModulePath, read_lora_modules_file

    spec = spec_of(adapters=[SQL, CHAT])
    path = tmp_path / c.ADAPTERS_KEY
    path.write_text(adapters_config_map(OWNER, spec, ["sql", "chat"])["data"][c.ADAPTERS_KEY])
    assert read_lora_modules_file(path) == [LoRAModulePath(a.name, adapter_path(spec, a)) for a in spec.adapters]
    assert read_lora_modules_file(tmp_path / "absent.json") == []  # a pod that started before the ConfigMap


def test_an_adapters_download_job_fetches_it_as_an_adapter():
    spec = spec_of(adapters=[SQL])
    job = download_job(OWNER, spec, WorkerDefaults(), "qwen-model-cache", adapter_source(spec.adapters[0]))
    (fetch,) = job["spec"]["template"]["spec"]["containers"]
    assert fetch["command"][:3] == ["hetero-infer", "fetch", SQL["url"]] and fetch["command"][-1] == "--adapter"
    assert job["metadata"]["annotations"][c.ADAPTER_ANNOTATION] == "sql"
    model_job = download_job(OWNER, spec, WorkerDefaults(), "qwen-model-cache")
    assert model_job["metadata"]["name"] != job["metadata"]["name"] and "--adapter" not in model_job["spec"][
        "template"]["spec"]["containers"][0]["command"]


@pytest.mark.parametrize(("adapters", "engine", "words"), [
    ([SQL, SQL], {}, "'sql' is given twice"),
    ([{"name": "qwen3", "url": SQL["url"]}], {}, "the model's own name"),
    ([{"name": "a b", "url": SQL["url"]}], {}, "adapter name"),
    ([{"name": "x", "url": "pvc://elsewhere/x"}], {}, "the workers mount no claim 'elsewhere'"),
    ([{"name": "x", "url": "ftp://x"}], {}, "hf://ORG/NAME"),
    (None, {"maxLoras": 2}, "give spec.adapters"),
])
def test_bad_adapters_are_refused_by_the_operator(adapters, engine, words):
    spec = {"model": CACHE, "engine": engine, **({"adapters": adapters} if adapters is not None else {})}
    with pytest.raises(SpecError, match=words):
        parse_spec(spec, "qwen")


def test_hub_adapters_need_the_cache():
    with pytest.raises(SpecError, match="downloaded once into spec.model.cache"):
        parse_spec({"model": {"name": "m"}, "adapters": [SQL]}, "qwen")
    parse_spec({"model": {"name": "m"}, "adapters": []}, "qwen")  # LoRA on, adapters loaded at run time


def test_the_crd_takes_adapters_and_refuses_bad_ones(crd):
    def obj(**spec: Any) -> dict[str, Any]:
        return {"apiVersion": c.API_VERSION, "kind": c.KIND, "metadata": {"name": "qwen", "namespace": "m"},
                "spec": {"model": CACHE, **spec}}

    assert validate(crd, obj(adapters=[SQL, CHAT], engine={"maxLoras": 2, "maxLoraRank": 64})) == []
    assert validate(crd, obj(adapters=[{"name": "x", "url": "ftp://x"}]))
    assert validate(crd, obj(adapters=[{"name": "a b", "url": SQL["url"]}]))
    assert validate(crd, obj(adapters=[{"name": "x"}]))
    assert validate(crd, obj(engine={"maxLoraRank": 100000}))


def test_status_lists_each_adapters_phase():
    spec = spec_of(adapters=[SQL, CHAT])
    states = (("sql", ModelState(READY, READY, "hf://org/sql-lora is in the cache", SQL["url"])),
              ("chat", ModelState("Failed", "NotFound", "s3://adapters/chat: no objects under this prefix",
                                  CHAT["url"])))
    status = compute_status(spec=spec, observed=Observed(generation=1, adapters=states), previous={},
                            selector="s", endpoint="e", now="2026-11-29T00:00:00Z")
    assert status["adapters"] == [
        {"name": "sql", "url": SQL["url"], "phase": "Ready", "reason": "Ready",
         "message": "hf://org/sql-lora is in the cache"},
        {"name": "chat", "url": CHAT["url"], "phase": "Failed", "reason": "NotFound",
         "message": "s3://adapters/chat: no objects under this prefix"}]
    gone = compute_status(spec=spec_of(), observed=Observed(generation=2), previous=status, selector="s",
                          endpoint="e", now="2026-11-29T00:00:00Z")
    assert gone["adapters"] is None  # removed from the status with the field


def test_status_counts_the_workers_that_serve_each_adapter(crd):
    """Each worker's /metrics names the adapters it serves; status.adapters[].loadedReplicas counts the ready pods
    that do (a pod that did not answer: None, counted for none)."""
    from hetero_infer.contracts.metric_names import LORA_ADAPTER_SERVED
    from hetero_infer.operator.served_adapters import loaded_replicas, served_adapters

    text = (f"# HELP {LORA_ADAPTER_SERVED} LoRA adapters this worker serves.\n# TYPE {LORA_ADAPTER_SERVED} gauge\n"
            f'{LORA_ADAPTER_SERVED}{{model_name="qwen3",lora_name="sql"}} 1.0\n'
            f'{LORA_ADAPTER_SERVED}{{model_name="qwen3",lora_name="chat"}} 1.0\n'
            f'{LORA_ADAPTER_SERVED}{{model_name="qwen3",lora_name="broken" 1.0\n'
            'vllm:lora_requests_info{max_lora="2",running_lora_adapters="old",waiting_lora_adapters=""} 1.7e9\n')
    assert served_adapters(text) == {"sql", "chat"}
    assert served_adapters("hetero_infer_num_requests_running 0.0\n") == frozenset()
    counts = loaded_replicas(["sql", "chat", "new"], [frozenset({"sql", "chat"}), frozenset({"sql"}), None])
    assert counts == {"sql": 2, "chat": 1, "new": 0}
    spec = spec_of(adapters=[SQL, CHAT])
    states = tuple((a["name"], ModelState(READY, READY, "in the cache", a["url"])) for a in (SQL, CHAT))
    status = compute_status(spec=spec, observed=Observed(generation=1, adapters=states, adapters_loaded=counts),
                            previous={}, selector="s", endpoint="e", now="2026-11-29T00:00:00Z")
    assert [(a["name"], a["loadedReplicas"]) for a in status["adapters"]] == [("sql", 2), ("chat", 1)]
    unread = compute_status(spec=spec, observed=Observed(generation=1, adapters=states), previous={}, selector="s",
                            endpoint="e", now="2026-11-29T00:00:00Z")
    assert all("loadedReplicas" not in a for a in unread["adapters"])  # the pods were not read: no number
    obj = {"apiVersion": c.API_VERSION, "kind": c.KIND, "metadata": {"name": "qwen", "namespace": "m"},
           "spec": {"model": CACHE, "adapters": [SQL, CHAT]}, "status": status}
    assert validate(crd, obj) == []


@pytest.mark.parametrize("version", ["1.30.0", kubernetes_validate.latest_version()])
def test_the_children_validate_against_the_kubernetes_schemas(version):
    spec = spec_of(adapters=[SQL, CHAT], engine={"maxLoras": 2})
    manifests = children(OWNER, spec, None, "KEY").all()
    manifests.append(adapters_config_map(OWNER, spec, ["sql"]))
    manifests += [download_job(OWNER, spec, WorkerDefaults(), "qwen-model-cache", adapter_source(a))
                  for a in spec.adapters]
    for manifest in manifests:
        kubernetes_validate.validate(strip_none(manifest), version, strict=True)

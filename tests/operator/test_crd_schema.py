"""The InferenceDeployment CRD: a valid CRD, accepts the examples, rejects what the operator cannot honour.

Every bad resource is checked twice: against the CRD schema (what the API server enforces) and
against the operator's own `parse_spec` (its second line of defence), so the two stay in step.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from crd_validation import defaulted, validate

from hetero_infer.operator import constants as c
from hetero_infer.operator import spec as s
from hetero_infer.operator.spec import SpecError, parse_spec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def base() -> dict[str, Any]:
    return {"apiVersion": c.API_VERSION, "kind": c.KIND, "metadata": {"name": "ok", "namespace": "default"},
            "spec": {"model": {"name": "smollm2"}}}


def with_spec(**changes: Any) -> dict[str, Any]:
    obj = base()
    obj["spec"].update(copy.deepcopy(changes))
    return obj


@pytest.mark.parametrize("version", ["1.30.0", kubernetes_validate.latest_version()])
def test_crd_is_a_valid_customresourcedefinition(crd: dict[str, Any], version: str) -> None:
    kubernetes_validate.validate(crd, version, strict=True)


def test_crd_names_subresources_and_columns(crd: dict[str, Any]) -> None:
    assert crd["metadata"]["name"] == c.CRD_NAME
    spec = crd["spec"]
    assert spec["group"] == c.GROUP and spec["scope"] == "Namespaced"
    assert spec["names"]["kind"] == c.KIND and spec["names"]["plural"] == c.PLURAL
    assert c.SHORT_NAME in spec["names"]["shortNames"]
    (version,) = spec["versions"]
    assert version["name"] == c.VERSION and version["served"] and version["storage"]
    assert version["subresources"]["status"] == {}
    assert version["subresources"]["scale"] == {"specReplicasPath": ".spec.replicas",
                                                "statusReplicasPath": ".status.replicas",
                                                "labelSelectorPath": ".status.selector"}
    columns = [col["name"] for col in version["additionalPrinterColumns"] if not col.get("priority")]
    assert columns == ["Model", "Replicas", "Ready", "Status", "KV-Usage", "Queue", "Age"]
    wide = {col["name"]: col["jsonPath"] for col in version["additionalPrinterColumns"] if col.get("priority")}
    assert wide["Router"] == ".status.router.availableReplicas"


def test_the_crd_files_are_generated_from_the_one_definition_and_current() -> None:
    """crds/ and the chart's copy are operator/crd.py's SCHEMA rendered: edit that and run
    `python -m hetero_infer.operator.crd` (this fails until the committed files are what it writes)."""
    from hetero_infer.operator import crd as definition

    text = definition.render()
    for path in (ROOT / "crds" / f"{c.CRD_NAME}.yaml", ROOT / "charts" / "hetero-infer" / "crds" / f"{c.CRD_NAME}.yaml"):
        assert path.read_text() == text, f"{path} is stale: run python -m hetero_infer.operator.crd"
    assert definition.main(["--check"]) == 0


def test_there_are_minimal_gpu_hpa_and_mock_examples() -> None:
    assert {p.stem for p in EXAMPLES} >= {"minimal", "gpu", "hpa", "mock"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_accepted_by_schema_and_operator(crd: dict[str, Any], path: Path) -> None:
    for obj in yaml.safe_load_all(path.read_text()):
        if obj["kind"] != c.KIND:  # what an example needs beside it (a PersistentVolumeClaim)
            kubernetes_validate.validate(obj, kubernetes_validate.latest_version(), strict=True)
            continue
        assert validate(crd, obj) == []
        parse_spec(obj["spec"], name=obj["metadata"]["name"])


@pytest.mark.parametrize("url", ["hf://meta-llama/Llama-3.1-8B-Instruct", "hf://gpt2", "hf://org/name@v1.0",
                                 "hf://org/name@0123456789abcdef0123456789abcdef01234567", "s3://models",
                                 "s3://my.models-1/llama/8b/", "pvc://weights", "pvc://weights/Qwen3-0.6B"])
def test_model_urls_are_accepted_by_schema_and_operator(crd: dict[str, Any], url: str) -> None:
    obj = with_spec(model={"name": "m", "url": url})
    assert validate(crd, obj) == []
    parse_spec(obj["spec"], name="ok")


@pytest.mark.parametrize("cache", [{"claimName": "shared-models"}, {"size": "50Gi"},
                                   {"size": 53687091200, "storageClassName": "nfs-client"}])
def test_model_caches_are_accepted_by_schema_and_operator(crd: dict[str, Any], cache: dict[str, Any]) -> None:
    obj = with_spec(model={"name": "m", "url": "hf://meta-llama/Llama-3.1-8B-Instruct", "cache": cache})
    assert validate(crd, obj) == []
    model = parse_spec(obj["spec"], name="ok").model
    assert model.cache == s.CacheSpec(claim_name=cache.get("claimName"), size=str(cache["size"]) if "size" in cache
                                      else None, storage_class_name=cache.get("storageClassName"))


@pytest.mark.parametrize("model", [{"path": "/opt/models/llama.Q4_K_M.gguf"}, {"url": "pvc://weights/llama.GGUF"},
                                   {"pvc": {"claimName": "weights", "subPath": "gguf/llama.Q8_0.gguf"}}])
def test_a_gguf_file_may_be_converted_into_a_cache(crd: dict[str, Any], model: dict[str, Any]) -> None:
    obj = with_spec(model={"name": "m", **model, "cache": {"size": "20Gi"}})
    assert validate(crd, obj) == []
    assert parse_spec(obj["spec"], name="ok").model.cache == s.CacheSpec(size="20Gi")


def test_the_gpu_example_gives_its_replicas_a_volume_they_can_all_mount() -> None:
    docs = list(yaml.safe_load_all((ROOT / "examples" / "gpu.yaml").read_text()))
    infd = next(d for d in docs if d["kind"] == c.KIND)
    claim = next(d for d in docs if d["kind"] == "PersistentVolumeClaim"
                 and d["metadata"]["name"] == infd["spec"]["model"]["pvc"]["claimName"])
    assert infd["spec"]["replicas"] > 1
    assert set(claim["spec"]["accessModes"]) & {"ReadWriteMany", "ReadOnlyMany"}
    assert infd["spec"]["model"]["pvc"].get("readOnly", True)


def test_schema_defaults_match_the_operator_defaults(crd: dict[str, Any]) -> None:
    obj = with_spec(autoscaling={"enabled": True, "maxReplicas": 3}, resources={}, service={}, engine={},
                    router={"inferencePool": {"endpointPicker": "epp"}})
    filled = defaulted(crd, obj)["spec"]
    assert filled["executor"] == s.DEFAULT_EXECUTOR and filled["replicas"] == s.DEFAULT_REPLICAS
    assert filled["resources"] == {"gpus": s.DEFAULT_GPUS, "gpuResource": s.DEFAULT_GPU_RESOURCE}
    assert filled["service"] == {"type": s.DEFAULT_SERVICE_TYPE, "port": s.DEFAULT_SERVICE_PORT}
    a = filled["autoscaling"]
    assert a["mode"] == s.DEFAULT_MODE and a["minReplicas"] == s.DEFAULT_MIN_REPLICAS
    assert a["targetKVCacheUsage"] == s.DEFAULT_TARGET_KV_CACHE_USAGE
    assert a["targetQueueDepth"] == s.DEFAULT_TARGET_QUEUE_DEPTH
    assert a["scaleUpStabilizationSeconds"] == s.DEFAULT_SCALE_UP_STABILIZATION_SECONDS
    assert a["scaleDownStabilizationSeconds"] == s.DEFAULT_SCALE_DOWN_STABILIZATION_SECONDS
    assert a["intervalSeconds"] == s.DEFAULT_INTERVAL_SECONDS
    assert a["scaleToZeroAfterSeconds"] == s.DEFAULT_SCALE_TO_ZERO_AFTER_SECONDS
    r = filled["router"]
    assert r["enabled"] is False and r["replicas"] == s.DEFAULT_ROUTER_REPLICAS
    assert r["policy"] == s.DEFAULT_ROUTER_POLICY and r["holdTimeoutSeconds"] == s.DEFAULT_HOLD_TIMEOUT_SECONDS
    assert r["inferencePool"]["endpointPickerPort"] == 9002
    # Parsing the raw spec (operator defaults) and the defaulted one (server defaults) agree.
    assert parse_spec(obj["spec"]) == parse_spec(filled)


BAD = {
    "negative replicas": (with_spec(replicas=-1), "spec.replicas"),
    "replicas of the wrong type": (with_spec(replicas="two"), "spec.replicas"),
    "unknown executor": (with_spec(executor="tensorrt"), "spec.executor"),
    "kv target above 1": (with_spec(autoscaling={"enabled": True, "maxReplicas": 2, "targetKVCacheUsage": 1.5}),
                          "targetKVCacheUsage"),
    "kv target of 0": (with_spec(autoscaling={"enabled": True, "maxReplicas": 2, "targetKVCacheUsage": 0}),
                       "targetKVCacheUsage"),
    "min above max": (with_spec(autoscaling={"enabled": True, "minReplicas": 5, "maxReplicas": 2}),
                      "minReplicas"),
    "max missing when enabled": (with_spec(autoscaling={"enabled": True}), "maxReplicas"),
    "unknown autoscaling mode": (with_spec(autoscaling={"mode": "keda", "maxReplicas": 2}), "mode"),
    "unknown top-level field": (with_spec(replica=2), "replica"),
    "unknown nested field": (with_spec(engine={"blockSize": 16, "pagedAttention": True}), "pagedAttention"),
    "engine value of the wrong type": (with_spec(engine={"maxNumSeqs": "many"}), "maxNumSeqs"),
    "block size out of range": (with_spec(engine={"blockSize": 0}), "blockSize"),
    "unknown dtype": (with_spec(engine={"dtype": "fp8"}), "dtype"),
    "unknown quantization": (with_spec(engine={"quantization": "awq"}), "quantization"),
    "memory threshold above 1": (with_spec(engine={"memoryThreshold": 1.2}), "memoryThreshold"),
    "nine gpus per worker": (with_spec(resources={"gpus": 9}), "gpus"),
    "a replica on two nodes (reserved)": (with_spec(resources={"nodes": 2}), "nodes"),
    "cpu not a quantity": (with_spec(resources={"cpu": "lots"}), "cpu"),
    "missing model": ({**base(), "spec": {"replicas": 1}}, "model"),
    "missing model name": (with_spec(model={"path": "/models/x"}), "name"),
    "two model sources": (with_spec(model={"name": "m", "path": "/m", "pvc": {"claimName": "c"}}), "at most one"),
    "relative model path": (with_spec(model={"name": "m", "path": "models/x"}), "path"),
    "subPath escaping the volume": (with_spec(model={"name": "m", "pvc": {"claimName": "c", "subPath": "a/../../etc"}}),
                                    "subPath"),
    "model url with an unknown scheme": (with_spec(model={"name": "m", "url": "gs://bucket/llama"}), "url"),
    "model url without a repository": (with_spec(model={"name": "m", "url": "hf://"}), "url"),
    "model url with an empty revision": (with_spec(model={"name": "m", "url": "hf://org/name@"}), "url"),
    "model url with a bad bucket": (with_spec(model={"name": "m", "url": "s3://B/x"}), "url"),
    "model url escaping its claim": (with_spec(model={"name": "m", "url": "pvc://weights/a/../../etc"}), "url"),
    "model url beside a pvc": (with_spec(model={"name": "m", "url": "hf://o/n", "pvc": {"claimName": "c"}}),
                               "at most one"),
    "model credentials not a Secret name": (with_spec(model={"name": "m", "url": "hf://o/n",
                                                             "credentialsSecret": "HF Token"}), "credentialsSecret"),
    "model download size not a quantity": (with_spec(model={"name": "m", "url": "hf://o/n", "downloadSize": "big"}),
                                           "downloadSize"),
    "model cache without a url": (with_spec(model={"name": "m", "cache": {"size": "50Gi"}}), "cache"),
    "model cache of a pvc:// url": (with_spec(model={"name": "m", "url": "pvc://weights/m", "cache": {"size": "5Gi"}}),
                                    "cache"),
    "model cache of a folder on a claim": (with_spec(model={"name": "m", "pvc": {"claimName": "w", "subPath": "llama"},
                                                         "cache": {"size": "5Gi"}}), "cache"),
    "model cache of a folder in the image": (with_spec(model={"name": "m", "path": "/models/llama",
                                                           "cache": {"size": "5Gi"}}), "cache"),
    "model cache with neither claim nor size": (with_spec(model={"name": "m", "url": "hf://o/n", "cache": {}}),
                                                "claimName"),
    "model cache with both claim and size": (with_spec(model={"name": "m", "url": "hf://o/n",
                                                              "cache": {"claimName": "c", "size": "5Gi"}}), "claimName"),
    "model cache class beside a claim": (with_spec(model={"name": "m", "url": "hf://o/n", "cache": {
        "claimName": "c", "storageClassName": "nfs"}}), "storageClassName"),
    "model cache size not a quantity": (with_spec(model={"name": "m", "url": "hf://o/n", "cache": {"size": "huge"}}),
                                        "size"),
    "model cache claim not a name": (with_spec(model={"name": "m", "url": "s3://b1/m", "cache": {"claimName": "My PVC"}}),
                                     "claimName"),
    "unknown model cache field": (with_spec(model={"name": "m", "url": "hf://o/n", "cache": {"size": "5Gi",
                                                                                             "accessMode": "RWO"}}),
                                  "accessMode"),
    "service port out of range": (with_spec(service={"port": 70000}), "port"),
    "unknown service type": (with_spec(service={"type": "ExternalName"}), "type"),
    "env without a name": (with_spec(env=[{"value": "x"}]), "name"),
    "env value of the wrong type": (with_spec(env=[{"name": "A", "value": 3}]), "value"),
    "toleration with an unknown effect": (with_spec(tolerations=[{"key": "k", "effect": "Sometimes"}]), "effect"),
    "nodeSelector value not a string": (with_spec(nodeSelector={"gpu": True}), "gpu"),
    "unknown rollout strategy": (with_spec(rollout={"strategy": "BlueGreen"}), "strategy"),
    "maxSurge beside Recreate": (with_spec(rollout={"strategy": "Recreate", "maxSurge": 1}), "RollingUpdate only"),
    "maxUnavailable neither a number nor a percentage": (with_spec(rollout={"maxUnavailable": "half"}),
                                                         "percentage"),
    "negative maxSurge": (with_spec(rollout={"maxSurge": -1}), "percentage"),
    "name longer than 63": ({**base(), "metadata": {"name": "x" * 64, "namespace": "default"}}, "63"),
    "scale to zero without the router": (with_spec(autoscaling={"enabled": True, "minReplicas": 0, "maxReplicas": 2}),
                                         "router"),
    "scale to zero with the router off": (with_spec(autoscaling={"enabled": True, "minReplicas": 0, "maxReplicas": 2},
                                                    router={"enabled": False}), "router"),
    "scale to zero in hpa mode": (with_spec(autoscaling={"enabled": True, "mode": "hpa", "minReplicas": 0,
                                                         "maxReplicas": 2}, router={"enabled": True}), "mode operator"),
    "unknown router policy": (with_spec(router={"enabled": True, "policy": "random"}), "policy"),
    "no router replicas": (with_spec(router={"enabled": True, "replicas": 0}), "replicas"),
    "router hold time-out of 0": (with_spec(router={"enabled": True, "holdTimeoutSeconds": 0}), "holdTimeoutSeconds"),
    "unknown router field": (with_spec(router={"enabled": True, "workers": 3}), "workers"),
    "router memory not a quantity": (with_spec(router={"resources": {"memory": "much"}}), "memory"),
    "inference pool without a picker": (with_spec(router={"inferencePool": {"endpointPickerPort": 9002}}),
                                        "endpointPicker"),
    "api key without a Secret name": (with_spec(apiKey={"secretKeyRef": {"key": "k"}}), "name"),
    "api key Secret name not a DNS name": (with_spec(apiKey={"secretKeyRef": {"name": "My_Secret", "key": "k"}}),
                                           "name"),
    "router api key without a key": (with_spec(router={"apiKey": {"secretKeyRef": {"name": "s"}}}), "key"),
    "pull secret without a name": (with_spec(imagePullSecrets=[{}]), "name"),
    "service account not a DNS name": (with_spec(serviceAccountName="Workers!"), "serviceAccountName"),
    "priority class not a string": (with_spec(priorityClassName=3), "priorityClassName"),
    "spread constraint without a topology key": (with_spec(topologySpreadConstraints=[
        {"maxSkew": 1, "whenUnsatisfiable": "DoNotSchedule"}]), "topologyKey"),
    "spread constraint with an unknown policy": (with_spec(topologySpreadConstraints=[
        {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "Sometimes"}]), "whenUnsatisfiable"),
    "pod label that selects the pods": (with_spec(podLabels={"app.kubernetes.io/component": "x"}), "podLabels"),
    "pod annotation not a string": (with_spec(podAnnotations={"a": 1}), "a"),
    "volume named like the operator's own": (with_spec(volumes=[{"name": "cache", "emptyDir": {}}]), "cache"),
    "mount of a volume that is not there": (with_spec(volumes=[{"name": "a", "emptyDir": {}}],
                                                      volumeMounts=[{"name": "b", "mountPath": "/b"}]), "volume"),
    "mount over the operator's own path": (with_spec(volumes=[{"name": "a", "emptyDir": {}}],
                                                     volumeMounts=[{"name": "a", "mountPath": "/models"}]), "/models"),
    "startup window under one probe period": (with_spec(startupTimeoutSeconds=5), "startupTimeoutSeconds"),
    "negative drain": (with_spec(drainSeconds=-1), "drainSeconds"),
    "grace shorter than the drain": (with_spec(drainSeconds=100, terminationGracePeriodSeconds=60),
                                     "terminationGracePeriodSeconds"),
    "grace shorter than the default drain": (with_spec(terminationGracePeriodSeconds=30),
                                             "terminationGracePeriodSeconds"),
    "gpu resource without a domain": (with_spec(resources={"gpus": 1, "gpuResource": "gpu"}), "gpuResource"),
    "gpu resource in kubernetes.io": (with_spec(resources={"gpus": 1, "gpuResource": "kubernetes.io/gpu"}),
                                      "gpuResource"),
    "download with an unknown field": (with_spec(model={"name": "m", "url": "hf://o/n", "cache": {
        "size": "5Gi", "download": {"nodeSelectors": {}}}}), "nodeSelectors"),
    "download service account not a DNS name": (with_spec(model={"name": "m", "url": "hf://o/n", "cache": {
        "size": "5Gi", "download": {"serviceAccountName": "S3 Reader"}}}), "serviceAccountName"),
    "download deadline under a minute": (with_spec(model={"name": "m", "url": "hf://o/n", "cache": {
        "size": "5Gi", "download": {"activeDeadlineSeconds": 5}}}), "activeDeadlineSeconds"),
    "download volume named like the Job's own": (with_spec(model={"name": "m", "url": "hf://o/n", "cache": {
        "size": "5Gi", "download": {"volumes": [{"name": "model", "emptyDir": {}}]}}}), "model"),
    "download mount of a volume that is not there": (with_spec(model={"name": "m", "url": "hf://o/n", "cache": {
        "size": "5Gi", "download": {"volumeMounts": [{"name": "ca", "mountPath": "/ca"}]}}}), "volume"),
    "download toleration with an unknown operator": (with_spec(model={"name": "m", "url": "hf://o/n", "cache": {
        "size": "5Gi", "download": {"tolerations": [{"key": "k", "operator": "Maybe"}]}}}), "operator"),
    "extra engine args not strings": (with_spec(engine={"extraArgs": [3]}), "extraArgs"),
    "json patch with an unknown op": (with_spec(jsonPatches=[{"op": "merge", "path": "/spec"}]), "op"),
    "json patch add without a value": (with_spec(jsonPatches=[{"op": "add", "path": "/spec/hostNetwork"}]), "value"),
    "json patch copy without from": (with_spec(jsonPatches=[{"op": "copy", "path": "/spec/x"}]), "from"),
    "shm size not a quantity": (with_spec(shmSize="lots"), "shmSize"),
    "liveness period of 0": (with_spec(probes={"liveness": {"periodSeconds": 0}}), "periodSeconds"),
    "readiness time-out beyond its period": (with_spec(probes={"readiness": {"periodSeconds": 5, "timeoutSeconds": 9}}),
                                             "timeoutSeconds"),
    "unknown probe": (with_spec(probes={"startup": {"periodSeconds": 5}}), "startup"),
    "pod running as root": (with_spec(podSecurityContext={"runAsUser": 0}), "runAsUser"),
    "pod allowed to run as root": (with_spec(podSecurityContext={"runAsNonRoot": False}), "runAsNonRoot"),
    "privileged worker": (with_spec(securityContext={"privileged": True}), "privileged"),
    "worker allowed to escalate": (with_spec(securityContext={"allowPrivilegeEscalation": True}),
                                   "allowPrivilegeEscalation"),
    "cache access modes none writable": (with_spec(model={"name": "m", "url": "hf://o/n", "cache": {
        "size": "5Gi", "accessModes": ["ReadOnlyMany"]}}), "writable"),
    "cache access mode unknown": (with_spec(model={"name": "m", "url": "hf://o/n", "cache": {
        "size": "5Gi", "accessModes": ["ReadWriteSometimes"]}}), "accessModes"),
    "cache of one node for two replicas": (with_spec(replicas=2, model={"name": "m", "url": "hf://o/n", "cache": {
        "size": "5Gi", "accessModes": ["ReadWriteOnce"]}}), "ReadOnlyMany"),
    "cache access modes beside a claim": (with_spec(model={"name": "m", "url": "hf://o/n", "cache": {
        "claimName": "c", "accessModes": ["ReadWriteOnce"]}}), "accessModes"),
    "cache volume name not a name": (with_spec(model={"name": "m", "url": "hf://o/n", "cache": {
        "size": "5Gi", "volumeName": "PV 1"}}), "volumeName"),
    "router pod label that selects the pods": (with_spec(router={"enabled": True, "podLabels": {
        "app.kubernetes.io/component": "x"}}), "podLabels"),
    "router toleration with an unknown effect": (with_spec(router={"tolerations": [{"key": "k", "effect": "Later"}]}),
                                                 "effect"),
    "name too long for the worker Service": ({**with_spec(router={"enabled": True}),
                                              "metadata": {"name": "x" * 56, "namespace": "default"}}, "55"),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_schema_rejects_bad_resources(crd: dict[str, Any], case: str) -> None:
    obj, needle = BAD[case]
    errors = validate(crd, obj)
    assert errors, f"the CRD schema accepted {case}"
    assert any(needle in e for e in errors), errors


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_operator_rejects_the_same_bad_specs_with_a_message(case: str) -> None:
    obj, needle = BAD[case]
    with pytest.raises(SpecError) as info:
        parse_spec(obj["spec"], name=obj["metadata"]["name"])
    assert any(needle in p for p in info.value.problems), info.value.problems

"""What kube-apiserver adds to the objects the operator writes (its defaulting functions, by hand).

Sources: k8s.io/kubernetes pkg/apis/{core,apps,autoscaling,policy}/v1*/defaults.go (SetDefaults_PodSpec,
SetDefaults_Container, SetDefaults_Probe, SetDefaults_Deployment, SetDefaults_Service,
SetDefaults_HorizontalPodAutoscalerBehavior, ...) as of Kubernetes 1.30. Only fields that are absent
are filled, as the real server does; the emulator runs this after every create and every merge patch,
so a patch that replaces a list (containers, ports) gets its defaults back, as on a real server.
"""

from __future__ import annotations

import ipaddress
import itertools
from typing import Any

_service_ips = (str(ipaddress.IPv4Address("10.96.0.10") + i) for i in itertools.count())
_node_ports = itertools.count(30000)


def image_pull_policy(image: str) -> str:
    """Kubernetes' default: Always for `:latest` or no tag, else IfNotPresent (digests included)."""
    if "@" in image:
        return "IfNotPresent"
    last = image.rsplit("/", 1)[-1]
    tag = last.split(":", 1)[1] if ":" in last else ""
    return "Always" if tag in ("", "latest") else "IfNotPresent"


def _probe(probe: dict[str, Any] | None) -> None:
    if not probe:
        return
    probe.setdefault("timeoutSeconds", 1)
    probe.setdefault("periodSeconds", 10)
    probe.setdefault("successThreshold", 1)
    probe.setdefault("failureThreshold", 3)
    if "httpGet" in probe:
        probe["httpGet"].setdefault("scheme", "HTTP")


def _container(container: dict[str, Any]) -> None:
    if container.get("image") and not container.get("imagePullPolicy"):
        container["imagePullPolicy"] = image_pull_policy(container["image"])
    container.setdefault("terminationMessagePath", "/dev/termination-log")
    container.setdefault("terminationMessagePolicy", "File")
    container.setdefault("resources", {})
    for port in container.get("ports") or []:
        port.setdefault("protocol", "TCP")
    for name in ("livenessProbe", "readinessProbe", "startupProbe"):
        _probe(container.get(name))
    for env in container.get("env") or []:
        field_ref = (env.get("valueFrom") or {}).get("fieldRef")
        if field_ref is not None:
            field_ref.setdefault("apiVersion", "v1")


def pod_spec(spec: dict[str, Any]) -> None:
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("securityContext", {})
    for container in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        _container(container)
    for volume in spec.get("volumes") or []:
        if "hostPath" in volume:
            volume["hostPath"].setdefault("type", "")
        for kind in ("secret", "configMap"):
            if kind in volume:
                volume[kind].setdefault("defaultMode", 0o644)


def deployment(obj: dict[str, Any]) -> None:
    spec = obj.setdefault("spec", {})
    spec.setdefault("replicas", 1)
    strategy = spec.setdefault("strategy", {})
    strategy.setdefault("type", "RollingUpdate")
    if strategy["type"] == "RollingUpdate":
        rolling = strategy.setdefault("rollingUpdate", {})
        rolling.setdefault("maxSurge", "25%")
        rolling.setdefault("maxUnavailable", "25%")
    spec.setdefault("revisionHistoryLimit", 10)
    spec.setdefault("progressDeadlineSeconds", 600)
    pod_spec(spec.setdefault("template", {}).setdefault("spec", {}))


def service(obj: dict[str, Any]) -> None:
    spec = obj.setdefault("spec", {})
    spec.setdefault("type", "ClusterIP")
    if spec["type"] != "ExternalName":
        if not spec.get("clusterIP"):
            spec["clusterIP"] = next(_service_ips)
        spec.setdefault("clusterIPs", [spec["clusterIP"]])
        spec.setdefault("ipFamilies", ["IPv4"])
        spec.setdefault("ipFamilyPolicy", "SingleStack")
        spec.setdefault("internalTrafficPolicy", "Cluster")
    spec.setdefault("sessionAffinity", "None")
    for port in spec.get("ports") or []:
        port.setdefault("protocol", "TCP")
        port.setdefault("targetPort", port.get("port"))
        if spec["type"] in ("NodePort", "LoadBalancer"):
            port.setdefault("nodePort", next(_node_ports))
    if spec["type"] in ("NodePort", "LoadBalancer"):
        spec.setdefault("externalTrafficPolicy", "Cluster")
    if spec["type"] == "LoadBalancer":
        spec.setdefault("allocateLoadBalancerNodePorts", True)


def pod_disruption_budget(obj: dict[str, Any]) -> None:
    obj.setdefault("spec", {})  # policy/v1 defaults nothing in the spec; the status is the controller's


def horizontal_pod_autoscaler(obj: dict[str, Any]) -> None:
    spec = obj.setdefault("spec", {})
    spec.setdefault("minReplicas", 1)
    behavior = spec.setdefault("behavior", {})
    up = behavior.setdefault("scaleUp", {})
    up.setdefault("stabilizationWindowSeconds", 0)
    up.setdefault("selectPolicy", "Max")
    up.setdefault("policies", [{"type": "Pods", "value": 4, "periodSeconds": 15},
                               {"type": "Percent", "value": 100, "periodSeconds": 15}])
    down = behavior.setdefault("scaleDown", {})
    down.setdefault("stabilizationWindowSeconds", 300)
    down.setdefault("selectPolicy", "Max")
    down.setdefault("policies", [{"type": "Percent", "value": 100, "periodSeconds": 15}])


def job(obj: dict[str, Any]) -> None:
    """What the API server adds to a Job: its selector by a generated uid (the pods' labels), the counts, the
    pod template's defaults (SetDefaults_Job, and the Job strategy's PrepareForCreate)."""
    spec = obj.setdefault("spec", {})
    uid = (obj.get("metadata") or {}).get("uid", "")
    name = (obj.get("metadata") or {}).get("name", "")
    spec.setdefault("parallelism", 1)
    spec.setdefault("completions", 1)
    spec.setdefault("backoffLimit", 6)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    spec.setdefault("manualSelector", False)
    spec.setdefault("podReplacementPolicy", "TerminatingOrFailed")
    spec.setdefault("selector", {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}})
    template = spec.setdefault("template", {})
    labels = template.setdefault("metadata", {}).setdefault("labels", {})
    for key, value in (("batch.kubernetes.io/controller-uid", uid), ("batch.kubernetes.io/job-name", name),
                       ("controller-uid", uid), ("job-name", name)):
        labels.setdefault(key, value)
    pod_spec(template.setdefault("spec", {}))


def persistent_volume_claim(obj: dict[str, Any]) -> None:
    spec = obj.setdefault("spec", {})
    spec.setdefault("volumeMode", "Filesystem")
    obj.setdefault("status", {"phase": "Pending"})


def pod(obj: dict[str, Any]) -> None:
    pod_spec(obj.setdefault("spec", {}))


BY_KIND = {
    "jobs": job,
    "persistentvolumeclaims": persistent_volume_claim,
    "pods": pod,
    "deployments": deployment,
    "services": service,
    "poddisruptionbudgets": pod_disruption_budget,
    "horizontalpodautoscalers": horizontal_pod_autoscaler,
}

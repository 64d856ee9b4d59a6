"""The InferencePool API (`inference.networking.k8s.io/v1`) as this project reads it: our own transcription.

Provenance: the `v1` InferencePool of kubernetes-sigs/gateway-api-inference-extension as released at tag v1.0.0
(the first `v1`) and at tag v1.6.0 (the newest when this was written), i.e. its generated CRD and API reference.
Nothing of theirs is copied here: the field set, types, bounds, enums, defaults, list types and patterns are
re-stated in our structure, and the CEL rules re-expressed by us so that they constrain the same thing. The
repository holds no third-party files, so the tests validate against this instead of the released CRD.

What differs between the two releases (everything else is the same in both):
- v1.0.0: `spec.endpointPickerRef` is required; `targetPorts` holds exactly one port; `matchLabels` is unbounded;
  no `spec.appProtocol`; no `status.parents[].controllerName`.
- v1.6.0: `endpointPickerRef` is optional; 1 to 8 target ports, their numbers unique (a CEL rule); 1 to 64
  `matchLabels`; `appProtocol` (`http`, the default, or `kubernetes.io/h2c`); `controllerName` in the status.

`crd(release)` gives a CustomResourceDefinition-shaped dict for crd_validation.py (structural defaults, schema,
CEL), which needs nothing else from it.
"""

from __future__ import annotations

from typing import Any

GROUP = "inference.networking.k8s.io"
VERSION = "v1"
KIND = "InferencePool"
PLURAL = "inferencepools"
RELEASES = ("v1.0.0", "v1.6.0")

# Regular expressions composed from the usual Kubernetes name grammars (the released patterns match the same set).
_DNS_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = rf"{_DNS_LABEL}(\.{_DNS_LABEL})*"
_LABEL_VALUE = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?"  # empty, or alphanumeric at both ends
_GROUP = rf"^$|^{_DNS_SUBDOMAIN}$"  # "" is the core group
_KIND = "^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$"
_NAMESPACE = rf"^{_DNS_LABEL}$"
_CONDITION_TYPE = rf"^({_DNS_SUBDOMAIN}/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
_CONDITION_REASON = "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
_CONTROLLER_NAME = rf"^{_DNS_SUBDOMAIN}\/[A-Za-z0-9\/\-._~%!$&'()*+,;=:]+$"  # a domain, a slash, a path

# CEL, ours. `kind` is defaulted to Service before the rules run, so an absent kind means Service here too.
RULE_PICKER_PORT = {"rule": "has(self.port) || self.kind != 'Service'",
                    "message": "a Service endpoint picker needs a port"}
RULE_UNIQUE_PORTS = {"rule": "self.all(a, self.filter(b, b.number == a.number).size() == 1)",
                     "message": "each target port number may appear once"}


def _string(*, min_length: int | None = None, max_length: int | None = None, pattern: str | None = None,
            **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "string", **extra}
    for key, value in (("minLength", min_length), ("maxLength", max_length), ("pattern", pattern)):
        if value is not None:
            out[key] = value
    return out


def _object(properties: dict[str, Any], required: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": properties, **extra}
    if required:
        out["required"] = sorted(required)
    return out


def _port() -> dict[str, Any]:
    """A port by number (the API's Port and its picker's port share the shape)."""
    return _object({"number": {"type": "integer", "format": "int32", "minimum": 1, "maximum": 65535}}, ["number"])


def _endpoint_picker_ref() -> dict[str, Any]:
    return _object({
        "group": _string(min_length=0, max_length=253, pattern=_GROUP, default=""),
        "kind": _string(min_length=1, max_length=63, pattern=_KIND, default="Service"),
        "name": _string(min_length=1, max_length=253),
        "port": _port(),
        "failureMode": _string(enum=["FailOpen", "FailClose"], default="FailClose"),
    }, ["name"], **{"x-kubernetes-validations": [RULE_PICKER_PORT]})


def _spec(release: str) -> dict[str, Any]:
    newer = release != "v1.0.0"
    label_values = _string(min_length=0, max_length=63, pattern=f"^{_LABEL_VALUE}$")
    match_labels: dict[str, Any] = {"type": "object", "additionalProperties": label_values}
    target_ports: dict[str, Any] = {"type": "array", "items": _port(), "minItems": 1, "maxItems": 8 if newer else 1,
                                    "x-kubernetes-list-type": "atomic"}
    properties = {
        "selector": _object({"matchLabels": match_labels}, ["matchLabels"]),
        "targetPorts": target_ports,
        "endpointPickerRef": _endpoint_picker_ref(),
    }
    if newer:
        match_labels.update(minProperties=1, maxProperties=64)
        target_ports["x-kubernetes-validations"] = [RULE_UNIQUE_PORTS]
        properties["appProtocol"] = _string(enum=["http", "kubernetes.io/h2c"], default="http")
    return _object(properties, ["selector", "targetPorts"] + ([] if newer else ["endpointPickerRef"]))


def _condition() -> dict[str, Any]:
    """A metav1.Condition, as every Kubernetes status list of conditions has it."""
    return _object({
        "type": _string(max_length=316, pattern=_CONDITION_TYPE),
        "status": _string(enum=["True", "False", "Unknown"]),
        "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
        "lastTransitionTime": _string(format="date-time"),
        "reason": _string(min_length=1, max_length=1024, pattern=_CONDITION_REASON),
        "message": _string(max_length=32768),
    }, ["type", "status", "lastTransitionTime", "reason", "message"])


def _status(release: str) -> dict[str, Any]:
    parent_ref = _object({
        "group": _string(min_length=0, max_length=253, pattern=_GROUP, default="gateway.networking.k8s.io"),
        "kind": _string(min_length=1, max_length=63, pattern=_KIND, default="Gateway"),
        "namespace": _string(min_length=1, max_length=63, pattern=_NAMESPACE),
        "name": _string(min_length=1, max_length=253),
    }, ["name"])
    parent: dict[str, Any] = {
        "parentRef": parent_ref,
        "conditions": {"type": "array", "items": _condition(), "maxItems": 8,
                       "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    }
    if release != "v1.0.0":
        parent["controllerName"] = _string(min_length=1, max_length=253, pattern=_CONTROLLER_NAME)
    parents = {"type": "array", "items": _object(parent, ["parentRef"]), "maxItems": 32,
               "x-kubernetes-list-type": "atomic"}
    return _object({"parents": parents})


def schema(release: str) -> dict[str, Any]:
    """The openAPIV3Schema of the `v1` version at `release`."""
    if release not in RELEASES:
        raise ValueError(f"no transcription of release {release!r}; known: {', '.join(RELEASES)}")
    return _object({
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
        "spec": _spec(release),
        "status": _status(release),
    }, ["spec"])


def crd(release: str) -> dict[str, Any]:
    """A CustomResourceDefinition carrying `schema(release)` as its only (served, storage) version."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {"kind": KIND, "listKind": f"{KIND}List", "plural": PLURAL, "singular": KIND.lower(),
                      "shortNames": ["infpool"]},
            "scope": "Namespaced",
            "versions": [{"name": VERSION, "served": True, "storage": True, "subresources": {"status": {}},
                          "schema": {"openAPIV3Schema": schema(release)}}],
        },
    }

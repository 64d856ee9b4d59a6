"""Validate custom resources against a CRD offline, the way kube-apiserver would.

kubernetes-validate checks built-in kinds and the CRD object itself, not custom resources against a
CRD. This does the latter: structural defaults, the OpenAPI v3 schema (via jsonschema, with the
Kubernetes extensions mapped: int-or-string, nullable, preserve-unknown-fields, and unknown fields
rejected as with `kubectl --validate=strict`) and the CEL `x-kubernetes-validations` rules (via
cel-python).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import celpy
import jsonschema


def version_schema(crd: Mapping[str, Any], version: str | None = None) -> dict[str, Any]:
    versions = crd["spec"]["versions"]
    chosen = next(v for v in versions if version is None or v["name"] == version)
    return chosen["schema"]["openAPIV3Schema"]


def to_json_schema(schema: Mapping[str, Any], root: bool = True) -> dict[str, Any]:
    """OpenAPI v3 (Kubernetes flavour) -> JSON Schema draft 4 (whose exclusiveMinimum is a boolean too)."""
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key.startswith("x-kubernetes-") or key in ("default", "description", "nullable", "format", "example"):
            continue
        if key == "properties":
            out[key] = {k: to_json_schema(v, root=False) for k, v in value.items()}
        elif key in ("items", "additionalProperties", "not") and isinstance(value, Mapping):
            out[key] = to_json_schema(value, root=False)
        elif key in ("anyOf", "allOf", "oneOf"):
            out[key] = [to_json_schema(v, root=False) for v in value]
        else:
            out[key] = copy.deepcopy(value)
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if schema.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    preserve = schema.get("x-kubernetes-preserve-unknown-fields")
    if out.get("type") == "object" and "properties" in out and "additionalProperties" not in out and not preserve:
        out["additionalProperties"] = False
    if root:  # the server always accepts these at the root, declared or not
        props = out.setdefault("properties", {})
        props["metadata"] = {"type": "object"}
        props.setdefault("apiVersion", {"type": "string"})
        props.setdefault("kind", {"type": "string"})
    return out


def apply_defaults(schema: Mapping[str, Any], value: Any) -> Any:
    """Structural defaulting: fill absent fields of present objects, recursively."""
    if isinstance(value, dict) and "properties" in schema:
        for key, sub in schema["properties"].items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                value[key] = apply_defaults(sub, value[key])
    elif isinstance(value, dict) and isinstance(schema.get("additionalProperties"), Mapping):
        for key in value:
            value[key] = apply_defaults(schema["additionalProperties"], value[key])
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [apply_defaults(schema["items"], v) for v in value]
    return value


_CEL = celpy.Environment()


def cel_errors(schema: Mapping[str, Any], value: Any, path: str = "") -> list[str]:
    errors: list[str] = []
    for rule in schema.get("x-kubernetes-validations") or []:
        program = _CEL.program(_CEL.compile(rule["rule"]))
        try:
            ok = program.evaluate({"self": celpy.json_to_cel(value)})
        except celpy.CELEvalError as e:  # a missing field the rule did not guard: the server rejects too
            ok, rule = False, dict(rule, message=f"{rule.get('message', rule['rule'])} ({e})")
        if not bool(ok):
            errors.append(f"{path or '<root>'}: {rule.get('message') or rule['rule']}")
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key in value:
                errors += cel_errors(sub, value[key], f"{path}.{key}")
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for i, item in enumerate(value):
            errors += cel_errors(schema["items"], item, f"{path}[{i}]")
    return errors


def validate(crd: Mapping[str, Any], obj: Mapping[str, Any]) -> list[str]:
    """Problems with `obj` as the API server would report them (empty list: accepted)."""
    schema = version_schema(crd)
    value = apply_defaults(schema, copy.deepcopy(dict(obj)))
    validator = jsonschema.Draft4Validator(to_json_schema(schema))
    errors = [f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
              for e in sorted(validator.iter_errors(value), key=lambda e: list(map(str, e.absolute_path)))]
    if not errors:
        errors = cel_errors(schema, value)
    return errors


def defaulted(crd: Mapping[str, Any], obj: Mapping[str, Any]) -> dict[str, Any]:
    return apply_defaults(version_schema(crd), copy.deepcopy(dict(obj)))

"""Typed OpenAPI v3 schema nodes for a CustomResourceDefinition (pure): the InferenceDeployment's schema is written
once with these (operator/crd.py), and both the CRD files (crds/, the chart's copy) and the operator's own checks
(spec.py: allowed keys, bounds, enums, defaults) are read from it.

Each node renders the structural-schema dict the API server takes (`openapi()`); `at(path)` walks a tree by a
spec path such as "spec.engine.blockSize" or "spec.tolerations[0].effect".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

QUANTITY_PATTERN = r"^[+]?(\d+(\.\d*)?|\.\d+)(([KMGTPE]i)|[numkMGTPE]|[eE][+-]?\d+)?$"
DNS1123_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


@dataclass(frozen=True)
class Rule:
    """A CEL validation rule (x-kubernetes-validations)."""

    rule: str
    message: str


@dataclass(frozen=True)
class Node:
    description: str | None = None
    rules: tuple[Rule, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)  # schema keywords rendered as given (rare)

    def own(self) -> dict[str, Any]:
        raise NotImplementedError

    def openapi(self) -> dict[str, Any]:
        out = self.own()
        if self.description is not None:
            out = {**({"type": out.pop("type")} if "type" in out else {}), "description": self.description, **out}
        out.update(self.extra)
        if self.rules:
            out["x-kubernetes-validations"] = [{"rule": r.rule, "message": r.message} for r in self.rules]
        return out

    @property
    def default(self) -> Any:
        return getattr(self, "default_value", None)


def _clean(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


@dataclass(frozen=True)
class Str(Node):
    enum: tuple[str, ...] | None = None
    pattern: str | None = None
    min_length: int | None = None
    max_length: int | None = None
    format: str | None = None
    default_value: str | None = None

    def own(self) -> dict[str, Any]:
        return _clean({"type": "string", "format": self.format, "enum": list(self.enum) if self.enum else None,
                       "default": self.default_value, "minLength": self.min_length, "maxLength": self.max_length,
                       "pattern": self.pattern})

    @property
    def regex(self) -> re.Pattern[str] | None:
        return re.compile(self.pattern) if self.pattern else None


@dataclass(frozen=True)
class Int(Node):
    minimum: int | None = None
    maximum: int | None = None
    format: str | None = None
    default_value: int | None = None

    def own(self) -> dict[str, Any]:
        return _clean({"type": "integer", "format": self.format, "minimum": self.minimum, "maximum": self.maximum,
                       "default": self.default_value})


@dataclass(frozen=True)
class Num(Node):
    minimum: float | None = None
    exclusive_minimum: bool = False
    maximum: float | None = None
    default_value: float | None = None

    def own(self) -> dict[str, Any]:
        return _clean({"type": "number", "minimum": self.minimum,
                       "exclusiveMinimum": True if self.exclusive_minimum else None, "maximum": self.maximum,
                       "default": self.default_value})


@dataclass(frozen=True)
class Bool(Node):
    default_value: bool | None = None

    def own(self) -> dict[str, Any]:
        return _clean({"type": "boolean", "default": self.default_value})


@dataclass(frozen=True)
class Quantity(Node):
    """A resource quantity (2, 500m, 4Gi): an int-or-string with Kubernetes' quantity pattern."""

    def own(self) -> dict[str, Any]:
        return {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True,
                "pattern": QUANTITY_PATTERN}


@dataclass(frozen=True)
class IntOrStr(Node):
    """An integer or a string (a maxSurge: 1 or 25%)."""

    def own(self) -> dict[str, Any]:
        return {"x-kubernetes-int-or-string": True}


@dataclass(frozen=True)
class Free(Node):
    """Any JSON value (an object's fields kept as given: a core/v1 type the API server checks itself)."""

    object: bool = True

    def own(self) -> dict[str, Any]:
        return {"type": "object", "x-kubernetes-preserve-unknown-fields": True} if self.object else {
            "x-kubernetes-preserve-unknown-fields": True}


@dataclass(frozen=True)
class Map(Node):
    """An object of string values (labels, annotations, a nodeSelector)."""

    def own(self) -> dict[str, Any]:
        return {"type": "object", "additionalProperties": {"type": "string"}}


@dataclass(frozen=True)
class Arr(Node):
    items: Node = field(default_factory=Str)
    min_items: int | None = None
    max_items: int | None = None
    default_value: list[Any] | None = None
    list_map_keys: tuple[str, ...] = ()

    def own(self) -> dict[str, Any]:
        out = _clean({"type": "array", "minItems": self.min_items, "maxItems": self.max_items,
                      "default": self.default_value})
        if self.list_map_keys:
            out["x-kubernetes-list-type"] = "map"
            out["x-kubernetes-list-map-keys"] = list(self.list_map_keys)
        out["items"] = self.items.openapi()
        return out


@dataclass(frozen=True)
class Obj(Node):
    properties: Mapping[str, Node] = field(default_factory=dict)
    required: tuple[str, ...] = ()
    preserve_unknown: bool = False  # known properties checked, others kept (core/v1 types with a few checked keys)

    def own(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "object"}
        if self.required:
            out["required"] = list(self.required)
        if self.preserve_unknown:
            out["x-kubernetes-preserve-unknown-fields"] = True
        if self.properties:
            out["properties"] = {k: v.openapi() for k, v in self.properties.items()}
        return out

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(self.properties)

    def at(self, path: str) -> Node:
        """The node at a dotted path below this object ("spec.engine.blockSize"; "[i]" steps into array items)."""
        node: Node = self
        for part in re.sub(r"\[\d+\]", ".[]", path).split("."):
            if part == "[]":
                assert isinstance(node, Arr), f"{path}: not an array"
                node = node.items
            elif part:
                assert isinstance(node, Obj) and part in node.properties, f"{path}: no field {part!r}"
                node = node.properties[part]
        return node

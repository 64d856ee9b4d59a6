"""Reading a raw spec: typed values out of nested mappings, every problem collected with the field's path
instead of raised (spec.py turns them into one SpecError, the operator into a Degraded condition)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
INT_OR_PERCENT = re.compile(r"^\d+%$")
QUANTITY = re.compile(r"^[+]?(\d+(\.\d*)?|\.\d+)(([KMGTPE]i)|[numkMGTPE]|[eE][+-]?\d+)?$")
# A DNS-1123 subdomain: the names of Secrets, ServiceAccounts, PriorityClasses, RuntimeClasses.
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

MISSING = object()


class Reader:
    """Reads typed values out of nested mappings, collecting problems instead of raising. With a `schema` (the CRD's,
    operator/crd.py), `field` and `keys` read a field's type, bounds, enum, pattern and default from it, so the
    operator's checks are the CRD's without restating them."""

    def __init__(self, schema: Any = None) -> None:
        self.problems: list[str] = []
        self.schema = schema

    def keys(self, path: str) -> tuple[str, ...]:
        """The fields the schema allows in the object at `path` (e.g. "spec.engine")."""
        return self.schema.at(path).keys

    def field(self, data: Mapping, key: str, path: str, what: str = "") -> Any:
        """data[key] (at `path`) checked as the schema's node for it says; its default when absent."""
        from hetero_infer.operator import schema as sc

        node = self.schema.at(f"{path}.{key}")
        if isinstance(node, sc.Int):
            return self.integer(data, key, path, node.default, minimum=node.minimum, maximum=node.maximum)
        if isinstance(node, sc.Num):
            assert node.minimum is None or node.exclusive_minimum, "Reader.number checks exclusive minimums only"
            return self.number(data, key, path, node.default, exclusive_minimum=node.minimum, maximum=node.maximum)
        if isinstance(node, sc.Str):
            return self.string(data, key, path, node.default, enum=node.enum, pattern=node.regex, what=what)
        if isinstance(node, sc.Bool):
            return self.boolean(data, key, path, bool(node.default))
        if isinstance(node, sc.Quantity):
            return self.quantity(data, key, path)
        raise TypeError(f"{path}.{key}: no typed read for {type(node).__name__}")

    def bad(self, path: str, message: str) -> None:
        self.problems.append(f"{path}: {message}")

    def obj(self, data: Any, path: str, allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> Mapping:
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            self.bad(path, f"must be an object, got {type_name(data)}")
            return {}
        for key in sorted(set(data) - set(allowed)):
            self.bad(f"{path}.{key}", "unknown field")
        for key in required:
            if data.get(key) is None:
                self.bad(f"{path}.{key}", "required field is missing")
        return data

    def integer(self, data: Mapping, key: str, path: str, default: Any = None,
                minimum: int | None = None, maximum: int | None = None) -> Any:
        value = data.get(key, MISSING)
        if value is MISSING or value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                self.bad(f"{path}.{key}", f"must be an integer, got {type_name(value)}")
                return default
        if minimum is not None and value < minimum:
            self.bad(f"{path}.{key}", f"must be >= {minimum}, got {value}")
            return default
        if maximum is not None and value > maximum:
            self.bad(f"{path}.{key}", f"must be <= {maximum}, got {value}")
            return default
        return value

    def number(self, data: Mapping, key: str, path: str, default: Any = None,
               exclusive_minimum: float | None = None, maximum: float | None = None) -> Any:
        value = data.get(key, MISSING)
        if value is MISSING or value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.bad(f"{path}.{key}", f"must be a number, got {type_name(value)}")
            return default
        if exclusive_minimum is not None and value <= exclusive_minimum:
            self.bad(f"{path}.{key}", f"must be > {exclusive_minimum}, got {value}")
            return default
        if maximum is not None and value > maximum:
            self.bad(f"{path}.{key}", f"must be <= {maximum}, got {value}")
            return default
        return float(value)

    def string(self, data: Mapping, key: str, path: str, default: Any = None,
               enum: tuple[str, ...] | None = None, pattern: re.Pattern[str] | None = None,
               what: str = "") -> Any:
        value = data.get(key, MISSING)
        if value is MISSING or value is None:
            return default
        if not isinstance(value, str):
            self.bad(f"{path}.{key}", f"must be a string, got {type_name(value)}")
            return default
        if enum is not None and value not in enum:
            self.bad(f"{path}.{key}", f"must be one of {', '.join(enum)}, got {value!r}")
            return default
        if pattern is not None and not pattern.match(value):
            self.bad(f"{path}.{key}", f"must be {what or 'of the form ' + pattern.pattern}, got {value!r}")
            return default
        if not value:
            self.bad(f"{path}.{key}", "must not be empty")
            return default
        return value

    def boolean(self, data: Mapping, key: str, path: str, default: bool) -> bool:
        value = data.get(key, MISSING)
        if value is MISSING or value is None:
            return default
        if not isinstance(value, bool):
            self.bad(f"{path}.{key}", f"must be a boolean, got {type_name(value)}")
            return default
        return value

    def quantity(self, data: Mapping, key: str, path: str) -> str | None:
        value = data.get(key, MISSING)
        if value is MISSING or value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            self.bad(f"{path}.{key}", f"must be a quantity such as 2, 500m or 4Gi, got {type_name(value)}")
            return None
        text = str(value)
        if not QUANTITY.match(text):
            self.bad(f"{path}.{key}", f"must be a quantity such as 2, 500m or 4Gi, got {text!r}")
            return None
        return text


def type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array",
            dict: "object"}.get(type(value), type(value).__name__)


def strings(r: Reader, data: Mapping, key: str, path: str, default: tuple[str, ...], min_items: int,
             max_items: int, max_length: int) -> tuple[str, ...]:
    """An array of strings, bounded like the CRD's (minItems, maxItems, maxLength)."""
    value = data.get(key, MISSING)
    if value is MISSING or value is None:
        return default
    if not isinstance(value, list):
        r.bad(f"{path}.{key}", f"must be an array of strings, got {type_name(value)}")
        return default
    if not min_items <= len(value) <= max_items:
        r.bad(f"{path}.{key}", f"must have {min_items} to {max_items} items, got {len(value)}")
        return default
    for i, item in enumerate(value):
        if not isinstance(item, str):
            r.bad(f"{path}.{key}[{i}]", f"must be a string, got {type_name(item)}")
            return default
        if len(item) > max_length:
            r.bad(f"{path}.{key}[{i}]", f"must be at most {max_length} characters, got {len(item)}")
            return default
    return tuple(value)


def string_map(r: Reader, raw: Any, path: str) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        r.bad(path, f"must be an object, got {type_name(raw)}")
        return {}
    out = {}
    for k, v in raw.items():
        if not isinstance(v, str):
            r.bad(f"{path}.{k}", f"must be a string, got {type_name(v)}")
        else:
            out[str(k)] = v
    return out

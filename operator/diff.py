"""Compare a desired manifest with a live object (pure).

A live object carries much more than what the operator wrote: server defaults, status, managed
fields, normalised quantities. The operator owns exactly the fields of its desired manifest, so a
child has drifted when one of those fields differs; everything else belongs to the server.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

_SUFFIXES = {
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
    "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"),
    "P": Decimal("1e15"), "E": Decimal("1e18"),
    "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30), "Ti": Decimal(2**40),
    "Pi": Decimal(2**50), "Ei": Decimal(2**60),
}
_QUANTITY = re.compile(r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$")


def parse_quantity(value: Any) -> Decimal | None:
    """A Kubernetes quantity ("500m", "4Gi", 2) as a Decimal; None when it is not one."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    m = _QUANTITY.match(str(value).strip())
    if not m:
        return None
    number, suffix = m.group(1), m.group(2) or ""
    try:
        if suffix[:1] in ("e", "E"):
            return Decimal(number + suffix)
        return Decimal(number) * _SUFFIXES[suffix]
    except (InvalidOperation, KeyError):
        return None


def _empty(value: Any) -> bool:
    return value is None or value is False or value == "" or value == {} or value == []


def strip_none(value: Any) -> Any:
    """A copy without the keys whose value is None (for creating an object)."""
    if isinstance(value, Mapping):
        return {k: strip_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [strip_none(v) for v in value]
    return value


def _scalar_equal(want: Any, have: Any) -> bool:
    if want == have and type(want) is type(have):
        return True
    if isinstance(want, bool) or isinstance(have, bool):
        return False
    a, b = parse_quantity(want), parse_quantity(have)
    return a is not None and b is not None and a == b


def differences(desired: Any, actual: Any, path: str = "") -> list[str]:
    """Paths where `actual` does not hold what `desired` says (desired None: must be absent or empty)."""
    if desired is None or _empty(desired):
        return [] if _empty(actual) else [path or "."]
    if isinstance(desired, Mapping):
        if not isinstance(actual, Mapping):
            return [path or "."]
        out: list[str] = []
        for key, want in desired.items():
            out += differences(want, actual.get(key), f"{path}.{key}")
        return out
    if isinstance(desired, list):
        if not isinstance(actual, list) or len(actual) != len(desired):
            return [path or "."]
        out = []
        for i, (want, have) in enumerate(zip(desired, actual, strict=True)):
            out += differences(want, have, f"{path}[{i}]")
        return out
    return [] if _scalar_equal(desired, actual) else [path or "."]


def owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(ref.get("uid") == uid for ref in refs)


def merge_patch(desired: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch that puts the desired fields in place (None removes a field).

    Immutable or server-owned identity fields (apiVersion, kind, name, namespace) are left out.
    """
    patch = {k: v for k, v in desired.items() if k not in ("apiVersion", "kind")}
    meta = {k: v for k, v in (desired.get("metadata") or {}).items() if k not in ("name", "namespace")}
    patch["metadata"] = meta
    return patch

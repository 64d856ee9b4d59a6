"""Compare a desired manifest with a live object (pure).

A live object carries much more than what the operator wrote: server defaults, status, managed
fields, normalised quantities. The operator owns exactly the fields it sets (the non-None fields of
its desired manifest), so a child has drifted when one of those differs; everything else, a field the
API server defaulted included, belongs to the server.

A None in a desired manifest means "the operator does not set this" (imagePullPolicy left to the
server's default for the tag, no nodeSelector): it is never compared. What the operator stops setting
when the spec changes (a nodeSelector removed from the spec) is removed through the fingerprint: every
child carries a hash of the manifest it was written from (`FINGERPRINT_ANNOTATION`), so a different
manifest is a difference, and its merge patch sends None for the fields to remove.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from hetero_infer.operator.constants import FINGERPRINT_ANNOTATION, SPEC_KEYS_ANNOTATION

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
        if suffix in _SUFFIXES:  # before the exponent form: "E" and "Ei" are the exa suffixes, not "1E"+digits
            return Decimal(number) * _SUFFIXES[suffix]
        if suffix[:1] in ("e", "E"):
            return Decimal(number + suffix)
        return None
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
    """Paths where `actual` does not hold what `desired` sets (desired None: not set, never compared)."""
    if desired is None:
        return []
    if _empty(desired):
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


def fingerprint(desired: Mapping[str, Any]) -> str:
    """A stable hash of a manifest as the operator would write it (its own annotation left out)."""
    meta = dict(desired.get("metadata") or {})
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items()
                   if k != FINGERPRINT_ANNOTATION and v is not None}  # an unset annotation is no annotation
    meta["annotations"] = annotations or None
    canonical = json.dumps(strip_none({**desired, "metadata": meta}), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def with_fingerprint(desired: Mapping[str, Any]) -> dict[str, Any]:
    """`desired` with its fingerprint annotation: a child written from another manifest differs there."""
    meta = dict(desired.get("metadata") or {})
    meta["annotations"] = {**(meta.get("annotations") or {}), FINGERPRINT_ANNOTATION: fingerprint(desired)}
    return {**desired, "metadata": meta}


def _patch_value(value: Any) -> Any:
    # In a merge patch a None in a map removes the key; a list is sent whole, so None has no meaning
    # inside one (the server would see `imagePullPolicy: null`): there it is left out.
    if isinstance(value, Mapping):
        return {k: _patch_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return strip_none(value)
    return value


def spec_keys(maps: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The SPEC_KEYS_ANNOTATION value for the spec's keys in these maps (by dotted path); None when there are
    none (no annotation: a child without such keys is written as before it existed)."""
    keys = {path: sorted(m) for path, m in maps.items() if m}
    return json.dumps(keys, sort_keys=True, separators=(",", ":")) if keys else None


def _dropped_keys(desired: Mapping[str, Any], live: Mapping[str, Any] | None) -> dict[str, list[str]]:
    """Keys the live child's SPEC_KEYS_ANNOTATION says the operator wrote, by path, that `desired` no longer has."""
    recorded = ((live or {}).get("metadata") or {}).get("annotations", {}).get(SPEC_KEYS_ANNOTATION)
    try:
        paths = json.loads(recorded) if recorded else {}
    except ValueError:
        return {}
    out = {}
    for path, keys in paths.items() if isinstance(paths, dict) else ():
        want: Any = desired
        for part in path.split("."):
            want = want.get(part) if isinstance(want, Mapping) else None
        gone = [k for k in keys if k not in (want or {})]
        if gone:
            out[path] = gone
    return out


def merge_patch(desired: Mapping[str, Any], live: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The JSON merge patch that puts the desired fields in place (None in a map removes a field), and removes
    the spec's keys that `live` records (SPEC_KEYS_ANNOTATION) and `desired` no longer has.

    Immutable or server-owned identity fields (apiVersion, kind, name, namespace) are left out.
    """
    patch = {k: _patch_value(v) for k, v in desired.items() if k not in ("apiVersion", "kind", "metadata")}
    meta = {k: _patch_value(v) for k, v in (desired.get("metadata") or {}).items() if k not in ("name", "namespace")}
    patch["metadata"] = meta
    for path, gone in _dropped_keys(desired, live).items():
        node: Any = patch
        for part in path.split("."):
            node = node.setdefault(part, {}) if isinstance(node, dict) else None
        if isinstance(node, dict):  # None: the whole map goes, these keys with it
            node.update(dict.fromkeys(gone))
    return patch

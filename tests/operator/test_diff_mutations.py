"""operator/diff.py cases that mutation testing found unchecked (docs/testing.md).

Quantities against the Kubernetes Python client's own parser (every suffix, not only the two the
manifests use), and the fingerprint: every field the operator writes, metadata included, changes it,
and the fingerprint annotation itself does not.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

import pytest
from kubernetes.utils.quantity import parse_quantity as k8s_parse_quantity

from hetero_infer.operator.constants import FINGERPRINT_ANNOTATION
from hetero_infer.operator.diff import differences, fingerprint, parse_quantity, with_fingerprint

SUFFIXES = ["n", "u", "m", "", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]


@pytest.mark.parametrize("text", ["1e3", "1E3", "2.5e-3", "4E2"])
def test_the_exponent_form_parses_like_the_kubernetes_client(text: str) -> None:
    assert parse_quantity(text) == Decimal(k8s_parse_quantity(text)), text


@pytest.mark.parametrize("suffix", SUFFIXES)
@pytest.mark.parametrize("number", ["1", "3", "0.5", "12.25", "-2"])
def test_every_suffix_parses_like_the_kubernetes_client(number: str, suffix: str) -> None:
    text = number + suffix
    assert parse_quantity(text) == Decimal(k8s_parse_quantity(text)), text


def _manifest(**metadata: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", **metadata},
            "spec": {"ports": [{"port": 80}]}}


def test_metadata_is_part_of_the_fingerprint() -> None:
    base = fingerprint(_manifest())
    assert fingerprint(_manifest(labels={"app": "x"})) != base
    assert fingerprint(_manifest(annotations={"note": "a"})) != base
    assert fingerprint(_manifest(annotations={"note": "a"})) != fingerprint(_manifest(annotations={"note": "b"}))
    assert fingerprint({**_manifest(), "metadata": {"name": "t"}}) != base


def test_the_fingerprint_annotation_does_not_change_the_fingerprint() -> None:
    for desired in (_manifest(), _manifest(annotations={"note": "a"}), _manifest(labels={"app": "x"})):
        stamped = with_fingerprint(desired)
        assert stamped["metadata"]["annotations"][FINGERPRINT_ANNOTATION] == fingerprint(desired)
        assert fingerprint(stamped) == fingerprint(desired)


def test_the_fingerprint_is_128_bits_of_hex() -> None:
    """Its format is part of every child the operator has written: a fingerprint of another length would
    make every existing child differ after an operator upgrade (a rewrite, and a rollout, of all of them)."""
    for desired in (_manifest(), _manifest(labels={"app": "x"})):
        assert re.fullmatch("[0-9a-f]{32}", fingerprint(desired))


@pytest.mark.parametrize("empty", [False, "", {}, []])
def test_an_empty_desired_value_matches_an_absent_or_empty_field_only(empty: Any) -> None:
    """The API server drops empty fields (false, "", {}, []): absent is what the operator wrote."""
    assert differences({"a": empty}, {}) == []
    assert differences({"a": empty}, {"a": None}) == []
    assert differences({"a": empty}, {"a": empty}) == []
    assert differences({"a": empty}, {"a": {"k": "v"}}) == [".a"]
    assert differences({"a": empty}, {"a": ["x"]}) == [".a"]


@pytest.mark.parametrize(("want", "have"), [(True, 1), (1, True), (False, 0), (True, "true"), ("1", True)])
def test_a_bool_never_equals_another_type(want: Any, have: Any) -> None:
    assert differences({"a": want}, {"a": have}) == [".a"]


def test_a_map_where_the_live_object_holds_something_else_is_reported_at_its_path() -> None:
    assert differences({"a": {"b": 1}}, {"a": 5}) == [".a"]
    assert differences({"a": {"b": 1}}, {"a": [1]}) == [".a"]
    assert differences({"b": 1}, None) == ["."]
    assert differences({"b": 1}, "x") == ["."]


def test_the_fingerprint_does_not_depend_on_key_order() -> None:
    """Manifests are built as dicts in code order; the same manifest built in another order is the same."""
    a = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "labels": {"x": "1", "y": "2"}},
         "spec": {"type": "ClusterIP", "ports": [{"port": 80, "name": "http"}]}}
    b = {"spec": {"ports": [{"name": "http", "port": 80}], "type": "ClusterIP"},
         "metadata": {"labels": {"y": "2", "x": "1"}, "name": "s"}, "kind": "Service", "apiVersion": "v1"}
    assert fingerprint(a) == fingerprint(b)

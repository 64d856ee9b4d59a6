"""Fixtures for the autoscaling tests: the operator tests' KMock fixtures, reused, plus worker pods.

`tests/operator` (its KMock emulator and the fixture that runs the real operator) is put on the
import path and its conftest is loaded under its own name, so both suites use one definition.
"""

from __future__ import annotations

import sys
from pathlib import Path

import kmock as kmock_lib
import pytest
from autoscale_fakes import PODS

OPERATOR_TESTS = Path(__file__).resolve().parents[1] / "operator"
if str(OPERATOR_TESTS) not in sys.path:
    sys.path.insert(0, str(OPERATOR_TESTS))


from borrowed_fixtures import operator_fixtures  # noqa: E402

_operator_fixtures = operator_fixtures()
crd = _operator_fixtures.crd
helm_bin = _operator_fixtures.helm_bin
kmock_options = _operator_fixtures.kmock_options
kubeconfig = _operator_fixtures.kubeconfig
operator = _operator_fixtures.operator


@pytest.fixture(autouse=True)
def _pods_resource(request: pytest.FixtureRequest) -> None:
    """KMock serves only declared resources: declare pods for the tests that use the API server."""
    if "kmock" in request.fixturenames:
        server = request.getfixturevalue("kmock")
        server.resources[PODS] = kmock_lib.ResourceInfo(kind="Pod", singular="pod", namespaced=True,
                                                        verbs={"get", "list", "watch", "create", "patch",
                                                               "delete"}, subresources={"status"})

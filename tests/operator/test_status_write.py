"""kube.patch_status: the status write under a resourceVersion precondition, retried on 409 (a fake API that
refuses stale versions as kube-apiserver does; the emulator-backed race is tests/autoscale/test_autoscale_status_race.py)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pytest

from hetero_infer.operator import kube

KIND = kube.INFERENCE_DEPLOYMENT


class VersionedApi:
    """One object; every write bumps its resourceVersion; `others` writes land before each of ours."""

    def __init__(self, others: int = 0) -> None:
        self.obj: dict[str, Any] | None = {"metadata": {"name": "x", "namespace": "ns", "resourceVersion": "1"},
                                           "status": {"conditions": [{"type": "A"}]}}
        self.others = others
        self.patches: list[Mapping[str, Any]] = []
        self.refused = 0
        self.gone = False  # get answers 404 (deleted meanwhile)

    def _bump(self) -> None:
        assert self.obj is not None
        self.obj["metadata"]["resourceVersion"] = str(int(self.obj["metadata"]["resourceVersion"]) + 1)

    def get(self, kind: kube.Kind, namespace: str, name: str) -> dict[str, Any] | None:
        return None if self.gone else copy.deepcopy(self.obj)

    def patch(self, kind: kube.Kind, namespace: str, name: str, patch: Mapping[str, Any],
              subresource: str | None = None) -> dict[str, Any]:
        assert (kind, subresource) == (KIND, "status") and self.obj is not None
        self.patches.append(copy.deepcopy(dict(patch)))
        if self.others:
            self.others -= 1
            self.obj["status"]["conditions"].append({"type": f"other{self.others}"})
            self._bump()
        if patch["metadata"]["resourceVersion"] != self.obj["metadata"]["resourceVersion"]:
            self.refused += 1
            raise kube.ApiError(409, "Conflict", "the object has been modified")
        self.obj["status"].update(patch["status"])
        self._bump()
        return copy.deepcopy(self.obj)


def add_b(obj: Mapping[str, Any]) -> dict[str, Any]:
    conds = [c for c in obj["status"]["conditions"] if c["type"] != "B"]
    return {"conditions": [*conds, {"type": "B"}]}


def test_a_conflict_reads_again_and_recomputes_from_the_new_version() -> None:
    api = VersionedApi(others=2)
    written = kube.patch_status(api, KIND, api.get(KIND, "ns", "x"), add_b)  # type: ignore[arg-type]
    assert api.refused == 2 and len(api.patches) == 3
    assert [p["metadata"]["resourceVersion"] for p in api.patches] == ["1", "2", "3"]
    assert api.obj is not None
    assert [c["type"] for c in api.obj["status"]["conditions"]] == ["A", "other1", "other0", "B"]
    assert written == {"conditions": api.obj["status"]["conditions"]}


def test_every_attempt_conflicting_raises_the_409() -> None:
    api = VersionedApi(others=10)
    with pytest.raises(kube.ApiError) as err:
        kube.patch_status(api, KIND, api.get(KIND, "ns", "x"), add_b, attempts=3)  # type: ignore[arg-type]
    assert err.value.conflict and len(api.patches) == 3


def test_nothing_to_write_or_object_gone_writes_nothing() -> None:
    api = VersionedApi()
    assert kube.patch_status(api, KIND, api.get(KIND, "ns", "x"), lambda obj: None) is None  # type: ignore[arg-type]
    assert api.patches == []
    body = api.get(KIND, "ns", "x")
    api.others, api.gone = 1, True
    assert kube.patch_status(api, KIND, body, add_b) is None  # type: ignore[arg-type]
    assert len(api.patches) == 1 and api.refused == 1

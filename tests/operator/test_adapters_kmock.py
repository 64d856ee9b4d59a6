"""spec.adapters with the real operator (kopf) against the API emulator: each hf:// or s3:// adapter downloaded by
its own Job into the model cache, listed to the workers (the ConfigMap they follow) once it is there, its phase in
status.adapters; adapters added and removed while the worker Deployment's pod template stays as it is: no rollout;
the field dropped: LoRA off, the list, the Jobs and the status entries gone.

The emulator has no Job controller: the test completes or fails the Jobs as the controller would."""

from __future__ import annotations

import json
from typing import Any

from kmock_cluster import CONFIG_MAPS, DEPLOYMENTS, INFD, JOBS, wait_for
from test_model_cache_kmock import COMPLETE, INFD_PATH, cached, job_name, job_status
from test_operator_kmock import create, live, patch

from hetero_infer.operator import constants as c

SQL = {"name": "sql", "url": "hf://org/sql-lora"}
CHAT = {"name": "chat", "url": "s3://adapters/chat"}
FAILED = {"failed": 7, "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}


def listed(kmock: Any) -> list[str] | None:
    cm = live(kmock, CONFIG_MAPS, "smol-adapters")
    return None if cm is None else [a["name"] for a in json.loads(cm["data"][c.ADAPTERS_KEY])]


def phases(kmock: Any) -> dict[str, str]:
    return {a["name"]: a["phase"] for a in ((live(kmock, INFD) or {}).get("status") or {}).get("adapters") or []}


async def test_adapters_come_and_go_without_a_rollout(kmock: Any, operator: Any) -> None:
    await operator("--resync-seconds", "0.2")
    await create(kmock, {**cached(), "spec": {**cached()["spec"], "adapters": [SQL]}})
    await wait_for(lambda: live(kmock, JOBS, job_name()), what="the model's download Job")
    await job_status(kmock, job_name(), COMPLETE)
    deployment = await wait_for(lambda: live(kmock, DEPLOYMENTS), what="the worker Deployment")
    pod = json.dumps(deployment["spec"]["template"], sort_keys=True)
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--enable-lora" in args and "--lora-modules-file" in args

    sql_job = await wait_for(lambda: live(kmock, JOBS, job_name(SQL["url"])), what="the adapter's download Job")
    (fetch,) = sql_job["spec"]["template"]["spec"]["containers"]
    assert fetch["command"][2] == SQL["url"] and "--adapter" in fetch["command"]
    await wait_for(lambda: listed(kmock) == [] and phases(kmock) == {"sql": "Pending"}, what="sql pending, unlisted")

    await job_status(kmock, job_name(SQL["url"]), COMPLETE)
    await wait_for(lambda: listed(kmock) == ["sql"] and phases(kmock) == {"sql": "Ready"}, what="sql listed")

    await patch(kmock, INFD_PATH, {"spec": {"adapters": [SQL, CHAT]}})
    await wait_for(lambda: live(kmock, JOBS, job_name(CHAT["url"])), what="chat's download Job")
    await wait_for(lambda: phases(kmock) == {"sql": "Ready", "chat": "Pending"}, what="chat pending")
    assert listed(kmock) == ["sql"]
    await job_status(kmock, job_name(CHAT["url"]), FAILED)
    await wait_for(lambda: phases(kmock).get("chat") == "Failed", what="chat failed")
    assert listed(kmock) == ["sql"]  # a failed adapter is not offered to the workers

    await patch(kmock, INFD_PATH, {"spec": {"adapters": [CHAT]}})
    await wait_for(lambda: listed(kmock) == [] and set(phases(kmock)) == {"chat"}, what="sql gone")
    await wait_for(lambda: live(kmock, JOBS, job_name(SQL["url"])) is None, what="sql's Job deleted")

    after = live(kmock, DEPLOYMENTS)
    assert json.dumps(after["spec"]["template"], sort_keys=True) == pod, "the adapters changed the pod template"
    assert after["metadata"].get("generation") == deployment["metadata"].get("generation")

    await patch(kmock, INFD_PATH, {"spec": {"adapters": None}})  # LoRA off: the list, the Jobs and the status go
    await wait_for(lambda: live(kmock, CONFIG_MAPS, "smol-adapters") is None, what="the ConfigMap deleted")
    await wait_for(lambda: live(kmock, JOBS, job_name(CHAT["url"])) is None, what="chat's Job deleted")
    await wait_for(lambda: "adapters" not in (live(kmock, INFD).get("status") or {}), what="status.adapters gone")
    assert "--enable-lora" not in live(kmock, DEPLOYMENTS)["spec"]["template"]["spec"]["containers"][0]["args"]

"""Is this operator replica the active one? (kopf's peering rule, for the work kopf does not pause.)

With peering, kopf pauses its watches and handlers in every replica but the one with the highest
priority among the live peers (all of them when two share the highest). The resync pass and the
autoscaler (loops.py) run outside kopf's handlers, so they ask this before each pass: the same rule,
read from the same peering object.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from hetero_infer.operator import kube

CLUSTER_PEERING = kube.Kind("kopf.dev/v1", "ClusterKopfPeering", "clusterkopfpeerings", namespaced=False)
NAMESPACED_PEERING = kube.Kind("kopf.dev/v1", "KopfPeering", "kopfpeerings")


@dataclass(frozen=True)
class Peering:
    name: str
    identity: str
    priority: int
    namespaces: tuple[str, ...] = ()  # empty: the cluster-wide peering object


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)  # noqa: UP017 (py3.10)


def is_active(status: Mapping[str, Any], identity: str, priority: int, now: datetime) -> bool:
    """No live peer other than `identity` has a priority >= ours (kopf pauses on equal ones too)."""
    for peer, info in (status or {}).items():
        if peer == identity or not isinstance(info, Mapping):
            continue
        seen = _parse_time(info.get("lastseen"))
        lifetime = info.get("lifetime", 60)
        if seen is None or not isinstance(lifetime, (int, float)) or seen + timedelta(seconds=lifetime) <= now:
            continue  # dead (kopf cleans such entries up)
        if int(info.get("priority", 0)) >= priority:
            return False
    return True


def active(client: kube.Client, peering: Peering | None, now: datetime | None = None) -> bool:
    """Whether this replica should work now (always without peering; a missing object counts as no peers)."""
    if peering is None:
        return True
    now = now or datetime.now(timezone.utc)  # noqa: UP017 (py3.10)
    places = [(NAMESPACED_PEERING, ns) for ns in peering.namespaces if "*" not in ns and "?" not in ns]
    for kind, ns in places or [(CLUSTER_PEERING, "")]:
        obj = client.get(kind, ns, peering.name)
        if obj is not None and not is_active(obj.get("status") or {}, peering.identity, peering.priority, now):
            return False
    return True

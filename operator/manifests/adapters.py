"""spec.adapters: the LoRA adapters the workers serve, as the ConfigMap NAME-adapters they follow (pure).

The workers run with `--enable-lora --lora-modules-file ADAPTERS_CONFIG_DIR/ADAPTERS_KEY` (manifests/worker.py) and
mount this ConfigMap there: the kubelet updates a mounted ConfigMap in place, and the worker loads the adapters the
file gains and unloads those it loses (worker/server/lora.py). So adding or removing an adapter changes this
ConfigMap only, never the pod template: no worker restarts. It lists only the adapters that are ready to load: an
hf:// or s3:// one once its download Job has put it into the cache (read at ADAPTERS_MOUNT/KEY/model, the cache claim
mounted whole), a pvc:// one at once (on the claim of spec.model.pvc or spec.model.cache.claimName).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from hetero_infer.operator import constants as c
from hetero_infer.operator.manifests.common import Owner, cache_key, metadata
from hetero_infer.operator.manifests.worker import MODEL_MOUNT, cached_model_path
from hetero_infer.operator.spec import AdapterSpec, InferenceSpec

ADAPTERS_FILE = f"{c.ADAPTERS_CONFIG_DIR}/{c.ADAPTERS_KEY}"


def adapters_name(owner_name: str) -> str:
    return owner_name + c.ADAPTERS_SUFFIX


def adapter_path(spec: InferenceSpec, adapter: AdapterSpec) -> str:
    """Where a worker reads the adapter's folder."""
    if adapter.downloaded:  # the download Job linked it at KEY/model of the cache claim
        return c.ADAPTERS_MOUNT + cached_model_path(cache_key(adapter.url))[len(MODEL_MOUNT):]
    claim, sub = adapter.claim_path
    model_pvc = spec.model.pvc
    root = MODEL_MOUNT if model_pvc is not None and model_pvc.claim_name == claim else c.ADAPTERS_MOUNT
    return f"{root}/{sub}"


def adapters_config_map(owner: Owner, spec: InferenceSpec, ready: Iterable[str]) -> dict[str, Any] | None:
    """The ConfigMap listing spec.adapters' adapters whose names are in `ready`, in the spec's order; None without
    spec.adapters."""
    if spec.adapters is None:
        return None
    ready = set(ready)
    listing = [{"name": a.name, "path": adapter_path(spec, a)} for a in spec.adapters if a.name in ready]
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(owner, adapters_name(owner.name)),
        "data": {c.ADAPTERS_KEY: json.dumps(listing, indent=1)},
    }

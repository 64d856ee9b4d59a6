"""What a worker says about its LoRA adapters, read by the router (pure functions).

Two sources, both the ones gateways built for vLLM read:
- `GET /v1/models`: an adapter's card names its base model in `parent` (vLLM's shape); the base model's card has
  no parent (or itself). So the router knows which served names are adapters and of which base.
- `vllm:lora_requests_info` on `/metrics` (the Gateway API Inference Extension's model-server protocol): a gauge
  whose value is the time it was set and whose labels are `max_lora` (adapter slots on the device),
  `running_lora_adapters` and `waiting_lora_adapters` (comma-separated names). A server may keep older label sets
  around (vLLM does); the sample with the latest timestamp is the current one, as the endpoint picker reads it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from hetero_infer.contracts.metric_names import VLLM_LORA_REQUESTS_INFO


@dataclass(frozen=True)
class LoraInfo:
    """One worker's adapter slots: how many (`max_lora`) and which adapters its requests use now."""

    max_lora: int
    running: frozenset[str] = frozenset()
    waiting: frozenset[str] = frozenset()

    @property
    def active(self) -> frozenset[str]:
        return self.running | self.waiting


def _names(text: str) -> frozenset[str]:
    return frozenset(n.strip() for n in text.split(",") if n.strip())


def parse_lora_info(text: str) -> LoraInfo | None:
    """The latest `vllm:lora_requests_info` sample of a Prometheus exposition; None when there is none (a worker
    without adapters) or it is unreadable. Only that family's lines are parsed (a worker's /metrics is long)."""
    lines = [line for line in text.splitlines() if line.startswith(VLLM_LORA_REQUESTS_INFO + "{")]
    if not lines:
        return None
    try:
        samples = [s for f in text_string_to_metric_families("\n".join(lines) + "\n") for s in f.samples]
    except ValueError:
        return None
    best = None
    for s in samples:
        try:
            info = LoraInfo(int(s.labels.get("max_lora", "0")), _names(s.labels.get("running_lora_adapters", "")),
                            _names(s.labels.get("waiting_lora_adapters", "")))
        except ValueError:
            continue
        if best is None or s.value >= best[0]:
            best = (s.value, info)
    return None if best is None else best[1]


def base_of(card: Mapping[str, Any]) -> str | None:
    """The base model an adapter's card names (its `parent`); None for a base model's card."""
    parent = card.get("parent")
    return parent if isinstance(parent, str) and parent and parent != card.get("id") else None


def adapter_bases(card_lists: Iterable[Iterable[Mapping[str, Any]]]) -> dict[str, str]:
    """adapter name -> its base model, over the cards of every worker."""
    out: dict[str, str] = {}
    for cards in card_lists:
        for card in cards:
            base = base_of(card)
            if base is not None:
                out.setdefault(card["id"], base)
    return out

"""Which model a request is for, and which models the router serves (pure functions).

Each worker says what it serves in its `GET /v1/models` (the base model and any adapters); the router routes a
request among the workers serving its `model`. An alias (`--model-alias NAME=MODEL[:WEIGHT]`) is resolved first:
one target is a rename; several are a weighted split (a canary) by weighted rendezvous hashing of the prompt's
first block, so a prefix stays with one target (its cache) while the shares follow the weights.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hetero_infer.contracts.errors import APIError
from hetero_infer.router.hashing import rendezvous

_UNIT = float(2**64)


def model_ids(listing: Any) -> list[dict[str, Any]]:
    """The model cards of a `GET /v1/models` answer (`{"data": [{"id": ...}, ...]}`); ValueError when it is not one."""
    data = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(data, list):
        raise ValueError("no data list")
    cards = [c for c in data if isinstance(c, dict) and isinstance(c.get("id"), str) and c["id"]]
    if len(cards) != len(data):
        raise ValueError("a model card without an id")
    return cards


def pick_target(targets: Sequence[tuple[str, float]], affinity: int | None, rng: random.Random | None = None) -> str:
    """One of an alias's (model, weight) targets: for a prompt (`affinity`, its first block hash) always the same
    one, each chosen for a share of prompts equal to its share of the weights (weighted rendezvous hashing); without
    a prompt, at random by weight."""
    if len(targets) == 1:
        return targets[0][0]
    if affinity is None:
        return (rng or random).choices([m for m, _ in targets], [w for _, w in targets])[0]

    def score(target: tuple[str, float]) -> float:
        model, weight = target
        u = (rendezvous(affinity, model) + 0.5) / _UNIT  # uniform in (0, 1) per (prompt, model)
        return -weight / math.log(u)

    return max(targets, key=score)[0]


def union_cards(card_lists: Iterable[Sequence[Mapping[str, Any]]], aliases: Iterable[str] = ()) -> list[dict]:
    """`/v1/models` of the router: every worker's cards, each model once (the first card seen), then the aliases,
    sorted by id."""
    out: dict[str, dict] = {}
    for cards in card_lists:
        for card in cards:
            out.setdefault(card["id"], dict(card))
    for name in aliases:
        out.setdefault(name, {"id": name, "object": "model", "created": 0, "owned_by": "hetero-infer"})
    return [out[k] for k in sorted(out)]


def model_not_found(model: str, served: Iterable[str]) -> APIError:
    names = sorted(set(served))
    listing = ", ".join(f"`{m}`" for m in names) if names else "no model yet"
    return APIError(404, f"The model `{model}` does not exist. This router serves {listing}.", param="model",
                    code="model_not_found")

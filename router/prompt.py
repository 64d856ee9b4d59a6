"""A request's prompt as block hashes: tokenized like the workers do (exact), or as text chunks (approximate)."""

from __future__ import annotations

import logging
from typing import Any

from hetero_infer.router.hashing import block_hashes, text_block_hashes

logger = logging.getLogger("hetero_infer.router")


def _resolve_model() -> Any:
    try:
        from hetero_infer.worker.runner.loader import resolve_model
    except ImportError:  # the layout before worker/runner/
        from hetero_infer.worker.model_loader import resolve_model
    return resolve_model


def load_tokenizer(name: str | None) -> Any:
    """The workers' tokenizer (hetero_infer.worker.tokenizer.Tokenizer), or None (text fallback) when `name` is
    unset or cannot be loaded."""
    if not name:
        return None
    try:
        from hetero_infer.worker.tokenizer import Tokenizer

        if name == "default":
            from hetero_infer.worker.runner.loader import resolve_model

            name = str(resolve_model(None)[0])
        return Tokenizer.from_pretrained(name)
    except Exception as exc:  # any failure leaves the router working, approximately
        logger.warning("tokenizer %r unavailable (%s): hashing prompt text instead", name, exc)
        return None


def prompt_text(payload: dict[str, Any]) -> str:
    """The text the fallback hashes: the completion prompt, or the chat messages' roles and contents."""
    if "messages" in payload:
        parts = []
        for m in payload.get("messages") or []:
            if isinstance(m, dict):
                content = m.get("content")
                if isinstance(content, list):
                    content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
                parts.append(f"<{m.get('role')}>{content or ''}")
        return "".join(parts)
    prompt = payload.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        prompt = prompt[0]
    return prompt if isinstance(prompt, str) else ""


def prompt_token_ids(payload: dict[str, Any], tokenizer: Any) -> list[int] | None:
    """The token ids the workers will see, where the prompt gives them or the tokenizer can make them."""
    prompt = payload.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
        prompt = prompt[0]
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return list(prompt)
    if tokenizer is None:
        return None
    if "messages" in payload:
        return tokenizer.apply_chat_template(payload["messages"])
    text = prompt_text(payload)
    return tokenizer.encode(text) if text else None


def request_hashes(payload: dict[str, Any], tokenizer: Any, block_size: int,
                   chunk_bytes: int) -> tuple[list[int], bool]:
    """Block hashes of the request's prompt, and whether they are token-block hashes (comparable with the
    workers' reports) rather than text chunks; [] for anything unreadable (routed as a cold prefix)."""
    try:
        ids = prompt_token_ids(payload, tokenizer)
    except Exception:  # a malformed request: the worker will answer it with a 400
        ids = None
    if ids is not None:
        return block_hashes(ids, block_size), True
    return text_block_hashes(prompt_text(payload), chunk_bytes), False

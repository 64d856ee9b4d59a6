"""A request's prompt as block hashes: tokenized like the workers do (exact), or as text chunks (approximate)."""

from __future__ import annotations

import json
from typing import Any

from hetero_infer.router.hashing import block_hashes, text_block_hashes


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


def chat_token_ids(body: bytes | str, tokenizer: Any) -> list[int]:
    """A chat request's prompt tokens as the workers make them: the request parsed by their model of it and
    rendered by their code (hetero_infer/contracts/chat_prompt.py `chat_template_inputs`: tools, tool calls,
    add_generation_prompt) with their tokenizer class."""
    from hetero_infer.contracts.chat_prompt import chat_template_inputs
    from hetero_infer.contracts.protocol import ChatCompletionRequest

    req = ChatCompletionRequest.model_validate_json(body)
    messages, kwargs = chat_template_inputs(req, getattr(tokenizer.hf, "chat_template", None))
    return tokenizer.apply_chat_template(messages, **kwargs)


def prompt_token_ids(payload: dict[str, Any], tokenizer: Any, body: bytes | str | None = None) -> list[int] | None:
    """The token ids the workers will see, where the prompt gives them or the tokenizer can make them (`body`:
    the request's JSON text, `payload` parsed; serialized again when not given)."""
    prompt = payload.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
        prompt = prompt[0]
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return list(prompt)
    if tokenizer is None:
        return None
    if "messages" in payload:
        return chat_token_ids(json.dumps(payload) if body is None else body, tokenizer)
    text = prompt_text(payload)
    return tokenizer.encode(text) if text else None


def request_hashes(payload: dict[str, Any], tokenizer: Any, block_size: int, chunk_bytes: int,
                   body: bytes | str | None = None, adapter: str | None = None) -> tuple[list[int], bool]:
    """Block hashes of the request's prompt, and whether they are token-block hashes (comparable with the
    workers' reports) rather than text chunks; [] for anything unreadable (routed as a cold prefix). `adapter`:
    the LoRA adapter the request names (its blocks hash from the adapter's root, as the workers hash them)."""
    try:
        ids = prompt_token_ids(payload, tokenizer, body)
    except Exception:  # a malformed request: the worker will answer it with a 400
        ids = None
    if ids is not None:
        return block_hashes(ids, block_size, adapter), True
    return text_block_hashes(prompt_text(payload), chunk_bytes, adapter), False

"""The bytes each token stands for, for logprobs: a byte-level BPE token (GPT-2 style) or a byte-fallback
token (`<0xE6>`, SentencePiece style) may hold part of a character, which decoding the token alone turns into
U+FFFD; its own bytes are what OpenAI's `bytes` reports and what text offsets are counted from."""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's map of printable characters back to bytes (the inverse of its `bytes_to_unicode`)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


def _decoder_types(hf: Any) -> set[str]:
    try:
        decoder = json.loads(hf.backend_tokenizer.to_str()).get("decoder") or {}
    except (AttributeError, ValueError):
        return set()
    parts = decoder.get("decoders", [decoder]) if decoder.get("type") == "Sequence" else [decoder]
    return {p.get("type", "") for p in parts if isinstance(p, dict)}


class TokenBytes:
    """token id -> its bytes (cached), for one tokenizer (the `Tokenizer` wrapper)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        hf = getattr(tokenizer, "hf", None)
        self._hf = hf
        types = _decoder_types(hf) if hf is not None else set()
        self._byte_level = _byte_level_decoder() if "ByteLevel" in types else None
        self._byte_fallback = "ByteFallback" in types
        self._special = getattr(tokenizer, "special_token_ids", frozenset())
        self._added = set(getattr(hf, "added_tokens_decoder", {}) or {})
        self._cache: dict[int, bytes] = {}

    def __call__(self, token_id: int, text: str) -> bytes:
        """The token's bytes; `text` is its text alone (what special and added tokens stand for)."""
        cached = self._cache.get(token_id)
        if cached is None:
            cached = self._cache[token_id] = self._bytes(token_id, text)
        return cached

    def _bytes(self, token_id: int, text: str) -> bytes:
        if self._hf is None or token_id in self._special or token_id in self._added:
            return text.encode()
        piece = self._hf.convert_ids_to_tokens(token_id)
        if not isinstance(piece, str):
            return text.encode()
        if self._byte_level is not None and all(c in self._byte_level for c in piece):
            return bytes(self._byte_level[c] for c in piece)
        if self._byte_fallback and (m := _BYTE_TOKEN.match(piece)):
            return bytes([int(m.group(1), 16)])
        return text.encode()


@lru_cache(maxsize=8)
def token_bytes_for(tokenizer: Any) -> TokenBytes:
    return TokenBytes(tokenizer)

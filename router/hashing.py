"""Block hashes of a prompt: the chain the router indexes and workers report.

A block is `block_size` consecutive token ids; only full blocks are hashed. Each hash covers its parent's hash
and its own tokens, so equal hashes mean equal prefixes. The hash is BLAKE2b-64 over fixed-width bytes, the same
in every process and Python version (Python's `hash()` of a tuple holding None is not: it changes per process on
3.11, so it cannot cross a process boundary).

Without a tokenizer the router falls back to chunks of the prompt's UTF-8 text (`text_block_hashes`): equal text
prefixes still give equal hashes, but they never match a worker's token-block report (approximate index only).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

HASH_NAME = "blake2b64-v1"  # named in the workers' block reports; a different name is not comparable
_ROOT = b"\x00" * 8  # the parent of the first block


def _digest(parent: bytes, payload: bytes) -> bytes:
    return hashlib.blake2b(parent + payload, digest_size=8).digest()


def chain_hash(parent: int | None, token_ids: Sequence[int]) -> int:
    """The hash of one block of `token_ids` whose preceding block hashed to `parent` (None: the first block)."""
    prefix = _ROOT if parent is None else parent.to_bytes(8, "little")
    return int.from_bytes(_digest(prefix, struct.pack(f"<{len(token_ids)}q", *token_ids)), "little")


def block_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """The chain hashes of every full block of `token_ids`."""
    out: list[int] = []
    parent = None
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = chain_hash(parent, token_ids[start : start + block_size])
        out.append(parent)
    return out


def text_block_hashes(text: str, chunk_bytes: int) -> list[int]:
    """The chain hashes of every full `chunk_bytes` chunk of `text` in UTF-8 (the no-tokenizer fallback)."""
    data = text.encode()
    out: list[int] = []
    parent = _ROOT
    for start in range(0, len(data) - chunk_bytes + 1, chunk_bytes):
        parent = _digest(b"t" + parent, data[start : start + chunk_bytes])
        out.append(int.from_bytes(parent, "little"))
    return out


def rendezvous(key: int, name: str) -> int:
    """A stable pseudo-random rank of `name` for `key` (highest-random-weight hashing): equal keys rank names
    alike, different keys spread over names."""
    return int.from_bytes(_digest(key.to_bytes(8, "little"), name.encode()), "little")

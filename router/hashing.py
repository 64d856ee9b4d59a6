"""Block hashes of a prompt: the token-block chain the workers report (`hetero_infer.contracts.block_hashes`, shared with
the worker), plus the router's own text-chunk fallback and rendezvous ranks.

Without a tokenizer the router falls back to chunks of the prompt's UTF-8 text (`text_block_hashes`): equal text
prefixes still give equal hashes, but they never match a worker's token-block report (approximate index only).
"""

from __future__ import annotations

from hetero_infer.contracts.block_hashes import HASH_NAME, blake2b64, block_hashes, chain_hash, chain_root

__all__ = ["HASH_NAME", "block_hashes", "chain_hash", "rendezvous", "text_block_hashes"]


def text_block_hashes(text: str, chunk_bytes: int, adapter: str | None = None) -> list[int]:
    """The chain hashes of every full `chunk_bytes` chunk of `text` in UTF-8 (the no-tokenizer fallback), from
    LoRA `adapter`'s root (None: the base model's) as the token chains."""
    data = text.encode()
    out: list[int] = []
    parent = chain_root(adapter)
    for start in range(0, len(data) - chunk_bytes + 1, chunk_bytes):
        parent = blake2b64(b"t" + parent, data[start : start + chunk_bytes])
        out.append(int.from_bytes(parent, "little"))
    return out


def rendezvous(key: int, name: str) -> int:
    """A stable pseudo-random rank of `name` for `key` (highest-random-weight hashing): equal keys rank names
    alike, different keys spread over names."""
    return int.from_bytes(blake2b64(key.to_bytes(8, "little"), name.encode()), "little")

"""The block-hash chain (`hetero_infer.contracts.block_hashes`, shared by the workers' block manager and the router): equal
prefixes give equal hashes, in every process."""

from __future__ import annotations

import subprocess
import sys

from hypothesis import given
from hypothesis import strategies as st

from hetero_infer.contracts.block_hashes import extend_chain
from hetero_infer.router.hashing import block_hashes, chain_hash, text_block_hashes

tokens = st.lists(st.integers(0, 2**31 - 1), max_size=80)


def test_same_hashes_in_another_process():
    ids = list(range(1000, 1040))
    code = ("from hetero_infer.router.hashing import block_hashes, text_block_hashes;"
            f"print(block_hashes({ids!r}, 16), text_block_hashes('x' * 100, 32))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"{block_hashes(ids, 16)} {text_block_hashes('x' * 100, 32)}"


@given(tokens, st.integers(1, 16))
def test_only_full_blocks_each_chained_on_its_parent(ids, bs):
    hashes = block_hashes(ids, bs)
    assert len(hashes) == len(ids) // bs
    parent = None
    for i, h in enumerate(hashes):
        assert h == chain_hash(parent, ids[i * bs : (i + 1) * bs])
        parent = h


@given(tokens, st.integers(1, 16), st.data())
def test_extending_a_chain_in_pieces_gives_the_whole_chain(ids, bs, data):
    """What the block manager does as a sequence's blocks fill up."""
    hashes: list[int] = []
    for upto in sorted(data.draw(st.lists(st.integers(0, len(ids) // bs), max_size=4))) + [len(ids) // bs]:
        extend_chain(hashes, ids, bs, upto)
        assert hashes == block_hashes(ids[: upto * bs], bs)


@given(tokens, tokens, st.integers(1, 8))
def test_hashes_agree_exactly_on_the_common_full_blocks(a, b, bs):
    common = 0
    while common < min(len(a), len(b)) and a[common] == b[common]:
        common += 1
    ha, hb = block_hashes(a, bs), block_hashes(b, bs)
    shared = 0
    while shared < min(len(ha), len(hb)) and ha[shared] == hb[shared]:
        shared += 1
    assert shared == min(common // bs, len(ha), len(hb))


def test_the_same_block_under_another_parent_hashes_differently():
    block = [5] * 4
    assert block_hashes(block * 2, 4)[1] != block_hashes(block, 4)[0]


@given(st.text(max_size=200), st.text(max_size=200), st.integers(1, 16))
def test_text_chunks_agree_on_the_common_byte_prefix(a, b, n):
    ba, bb = a.encode(), b.encode()
    common = 0
    while common < min(len(ba), len(bb)) and ba[common] == bb[common]:
        common += 1
    ha, hb = text_block_hashes(a, n), text_block_hashes(b, n)
    shared = sum(1 for _ in zip(ha, hb))
    shared = next((i for i, (x, y) in enumerate(zip(ha, hb)) if x != y), shared)
    assert shared == min(common // n, len(ha), len(hb))

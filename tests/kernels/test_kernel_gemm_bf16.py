"""The bfloat16 GEMM (kernels/cpu/csrc/gemm.c) against float64 on odd shapes: every combination of its
register tiles (6, 4, 2 and 1 rows), the passes of more than 240 rows, column tails of a panel, one to three
threads (work split by panels and by blocks of rows), and weights packed side by side in the huge-page arena (kernels/cpu/weight_arena.py)."""

from __future__ import annotations

import pytest
import torch

from hetero_infer.kernels.cpu import linear as cpu_linear
from hetero_infer.kernels.cpu import weight_arena

pytestmark = pytest.mark.skipif(cpu_linear._gemm_bf16() is None, reason="no AVX512_BF16 or AVX2 + FMA in this build of the "
                                "C kernels (tests/engine/test_cpu_linear.py::test_bf16_gemm_against_float64 fails where the CPU has it "
                                "and the kernel is missing)")

# rows: each tile alone and with every tail (6+1, 6+2, 6+4, 6+4+1, 6+6+2+1), one row past a 240-row pass
ROWS = [1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 15, 241, 487]
SHAPES = [(2, 1), (34, 17), (130, 63), (96, 65), (576, 129)]  # (in, out): K even, N off the 64-column panels


def _reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return x.double() @ w.double().T + (b.double() if b is not None else 0)


def _check(out: torch.Tensor, ref: torch.Tensor, k: int) -> None:
    assert out.dtype == torch.bfloat16 and out.shape == ref.shape
    # exact bfloat16 products, float32 sums, one rounding to bfloat16
    torch.testing.assert_close(out.double(), ref, rtol=2**-8, atol=1e-3 * k**0.5)


@pytest.mark.parametrize("k,n", SHAPES)
@pytest.mark.parametrize("threads", [1, 2])
def test_gemm_bf16_every_tile_against_float64(k, n, threads):
    gen = torch.Generator().manual_seed(k * 1000 + n)
    w = torch.randn(n, k, generator=gen).to(torch.bfloat16)
    b = torch.randn(n, generator=gen).to(torch.bfloat16)
    packed = cpu_linear.pack_as("gemm_bf16", w)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for rows in ROWS:
            x = torch.randn(rows, k, generator=gen).to(torch.bfloat16)
            _check(cpu_linear.packed_linear(x, packed, b), _reference(x, w, b), k)
            _check(cpu_linear.packed_linear(x, packed, None), _reference(x, w, None), k)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("n", [1000, 576, 960, 64])  # 16, 9, 15 and 1 panels: split evenly or in row blocks
def test_gemm_bf16_parallel_calls_against_float64(threads, n):
    """Decode-sized calls, parallel over (panel, row block) items; 3 threads (oversubscribed here) cut a panel
    into three blocks."""
    gen = torch.Generator().manual_seed(n + threads)
    w = torch.randn(n, 576, generator=gen).to(torch.bfloat16)
    b = torch.randn(n, generator=gen).to(torch.bfloat16)
    packed = cpu_linear.pack_as("gemm_bf16", w)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for rows in (1, 9, 12, 13, 16, 19, 32, 33, 64):
            x = torch.randn(rows, 576, generator=gen).to(torch.bfloat16)
            _check(cpu_linear.packed_linear(x, packed, b), _reference(x, w, b), 576)
    finally:
        torch.set_num_threads(before)


def test_weights_packed_side_by_side_keep_their_own_values():
    """Weights bump-allocated in one chunk (and one past the chunk) do not overlap: each still gives its own
    product after all are packed."""
    arena = weight_arena.HugePageArena(chunk_bytes=1 << 20)
    gen = torch.Generator().manual_seed(2)
    weights = [torch.randn(n, 320, generator=gen).to(torch.bfloat16) for n in (130, 100, 257, 64, 600, 1700)]
    datas = [arena.zeros((-(-w.shape[0] // 64), 160, 64, 2), torch.bfloat16) for w in weights]
    starts = sorted((d.data_ptr(), d.data_ptr() + d.numel() * 2) for d in datas)
    assert all(end <= nxt for (_, end), (nxt, _) in zip(starts, starts[1:]))
    assert all(d.data_ptr() % 64 == 0 and d.is_contiguous() for d in datas)
    packed = [cpu_linear.pack_as("gemm_bf16", w) for w in weights]
    x = torch.randn(5, 320, generator=gen).to(torch.bfloat16)
    for w, p in zip(weights, packed):
        _check(cpu_linear.packed_linear(x, p, None), _reference(x, w, None), 320)


def test_arena_hands_out_zeroed_tensors_of_the_shape_asked():
    arena = weight_arena.HugePageArena(chunk_bytes=1 << 20)
    small = arena.zeros((3, 5), torch.bfloat16)  # below MIN_BYTES: an ordinary tensor
    big = arena.zeros((300, 600), torch.bfloat16)
    own = arena.zeros((700, 1024), torch.bfloat16)  # over half a chunk: its own pages
    for t, shape in ((small, (3, 5)), (big, (300, 600)), (own, (700, 1024))):
        assert t.shape == shape and t.dtype == torch.bfloat16 and t.is_contiguous()
        assert not t.any()

"""Shared helpers for the kernel tests: tolerances, poisoning, paged-cache builders and
naive float64 oracles written independently of hetero_infer.kernels.reference."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# Tolerances against a float64 oracle, per output dtype. (atol, rtol) for an element-wise
# check |out - ref| <= atol + rtol * |ref|, and a bound on ||out - ref|| / ||ref||.
# float32: kernels accumulate in float32 (exact float32 dots, never tf32).
# float16: one rounding of the output (2^-11) plus the softmax weights rounded to fp16
#          before the PV product, as every flash-attention kernel does.
# bfloat16: the same with 2^-8; Triton's CPU interpreter also truncates instead of
#          rounding on float32 -> bfloat16 casts, worth up to one more ulp.
TOL = {
    torch.float32: (2e-5, 2e-5, 1e-5),
    torch.float16: (2e-3, 4e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 2e-2, 1e-2),
}


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, scale: float = 1.0, what: str = "",
                 slack: torch.Tensor | None = None):
    """Compare ``out`` with a (float64) oracle ``ref`` at the tolerance of ``dtype``.

    ``scale`` widens the tolerance for ops that add rounding steps (e.g. a long dot). ``slack``: an element-wise
    allowance added to the bound (`dot_slack`: the float32 accumulation of a long dot).
    NaN or inf anywhere fails (poisoned outputs that were never written show up so).
    """
    atol, rtol, nrel = TOL[dtype]
    atol, rtol, nrel = atol * scale, rtol * scale, nrel * scale
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    o = out.detach().to("cpu", torch.float64)
    r = ref.detach().to("cpu", torch.float64)
    assert torch.isfinite(o).all(), f"{what}: output has NaN/inf (unwritten poisoned elements?)"
    err = (o - r).abs()
    bound = atol + rtol * r.abs()
    if slack is not None:
        bound = bound + slack.detach().to("cpu", torch.float64)
    bad = err > bound
    if bad.any():
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())}/{bad.numel()} elements off; worst abs err {err.max():.3g}; "
            f"first at {idx}: got {o[idx]:.6g}, want {r[idx]:.6g}"
        )
    denom = r.norm()
    if denom > 0:
        rel = float((o - r).norm() / denom)
        assert rel <= nrel, f"{what}: relative error {rel:.3g} > {nrel:.3g}"


def dot_slack(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The rounding a float32 accumulation may add to ``x @ w.T`` beyond the output's own: a few float32 ulps of
    sum |x_i w_i| (on K = 4096 random rows an exact-float32 kernel's sums land ~3e-4 from float64 where the
    result is ~1, while tf32 inputs would be ~3e-2 off: this allowance still tells the two apart)."""
    return 4 * 2.0**-24 * (x.detach().cpu().double().abs() @ w.detach().cpu().double().abs().t())


def poison(t: torch.Tensor) -> torch.Tensor:
    """Fill with NaN (floats) so unwritten outputs are detected."""
    if t.is_floating_point():
        t.fill_(float("nan"))
    else:
        t.fill_(-7)
    return t


def randn(*shape, dtype, device, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, dtype=torch.float32) * scale).to(device=device, dtype=dtype)


@dataclass
class PagedBatch:
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    context_lens: torch.Tensor
    block_size: int


def make_paged_kv(
    context_lens: list[int],
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    device,
    extra_blocks: int = 3,
    junk_tail: bool = True,
    index_dtype=torch.int32,
) -> PagedBatch:
    """A random paged cache and block tables with blocks scattered in random order.

    Table entries past each sequence's last block hold out-of-range junk, which a
    correct kernel never reads."""
    needed = [max(1, math.ceil(n / block_size)) for n in context_lens]
    max_blocks = max(needed) + 1
    num_blocks = sum(needed) + extra_blocks
    perm = torch.randperm(num_blocks)
    k_cache = randn(num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype, device=device)
    v_cache = randn(num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype, device=device)
    table = torch.full((len(context_lens), max_blocks), 10**6 if junk_tail else 0, dtype=torch.int64)
    used = 0
    for b, n in enumerate(needed):
        table[b, :n] = perm[used : used + n]
        used += n
    return PagedBatch(
        k_cache,
        v_cache,
        table.to(device=device, dtype=index_dtype),
        torch.tensor(context_lens, dtype=index_dtype, device=device),
        block_size,
    )


def dense_kv(batch: PagedBatch, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequence b's keys/values as float64 [ctx, KVH, D] on the cache's device: token j read from block
    ``table[j // block_size]`` at offset ``j % block_size``."""
    n = int(batch.context_lens[b])
    j = torch.arange(n)
    blocks = batch.block_tables[b].cpu().long()[j // batch.block_size].to(batch.k_cache.device)
    offsets = (j % batch.block_size).to(batch.k_cache.device)
    return batch.k_cache[blocks, offsets].double(), batch.v_cache[blocks, offsets].double()


def naive_attention_rows(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: list[int], scale: float, window: int | None = None
) -> torch.Tensor:
    """q [R, H, D] at the given positions over dense k/v [L, KVH, D], in float64 on k's device (a GPU's
    float64 units where the kernel ran on one): the full score matrix of every head at once, masked
    (causal, optional window), softmax, weighted sum. Returns [R, H, D] float64 on the CPU."""
    r_count, h, d = q.shape
    out = torch.zeros(r_count, h, d, dtype=torch.float64)
    length, kvh = k.shape[0], k.shape[1]
    if r_count == 0 or length == 0:
        return out
    g = h // kvh
    dev = k.device
    k, v = k.double(), v.double().to(dev)
    qd = q.to(dev, torch.float64).reshape(r_count, kvh, g, d)
    pos = torch.tensor(positions, dtype=torch.long, device=dev)[:, None]
    j = torch.arange(length, device=dev)[None, :]
    allowed = j <= pos
    if window:
        allowed &= j > pos - window
    rows = max(1, (1 << 25) // (h * length))  # bounds the [H, rows, L] score block to 256 MiB
    for r0 in range(0, r_count, rows):
        r1 = min(r_count, r0 + rows)
        s = torch.einsum("rkgd,lkd->kgrl", qd[r0:r1], k) * scale
        s = s.masked_fill(~allowed[r0:r1], float("-inf"))
        o = torch.einsum("kgrl,lkd->rkgd", torch.softmax(s, dim=-1), v)
        out[r0:r1] = o.reshape(r1 - r0, h, d).cpu()
    return out


def strided_view(t: torch.Tensor, extra_heads: int = 2) -> torch.Tensor:
    """The same values as ``t`` [T, H, D] but as a view into a wider buffer (like a slice of
    a fused QKV projection)."""
    tt, h, d = t.shape
    buf = torch.randn(tt, h + extra_heads, d, dtype=torch.float32).to(device=t.device, dtype=t.dtype)
    view = buf[:, 1 : 1 + h]
    view.copy_(t)
    assert not view.is_contiguous()
    return view

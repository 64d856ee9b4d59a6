"""Plain-PyTorch reference implementations of every kernel.

These run on any device and are (1) the CPU path of :mod:`hetero_infer.kernels` and
(2) the oracle the Triton kernels are tested against. They compute in float32 (float64
when given float64 inputs, which the tests use as a high-precision oracle) and round to
the output dtype once.

The functions here do no argument validation beyond what the math needs; the public
wrappers in :mod:`hetero_infer.kernels` validate and then dispatch here or to Triton.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

__all__ = [
    "write_kv_cache",
    "paged_attention_decode",
    "paged_attention_prefill",
    "rms_norm",
    "rotary_embedding",
    "compute_inv_freq",
    "compute_cos_sin_cache",
    "silu_and_mul",
    "quantize_int8",
    "dequantize_int8",
    "quantize_int4",
    "dequantize_int4",
    "int8_matmul",
    "int4_matmul",
    "top_k_top_p_filter",
    "ExpertWeights",
    "moe_routing",
    "fused_moe",
    "lora_shrink",
    "lora_expand",
]


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


# --------------------------------------------------------------------------- KV cache


def write_kv_cache(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store token ``t``'s K/V rows at slot ``slot_mapping[t]`` (block * block_size + offset).

    Slots below zero are padding and are skipped.
    """
    block_size = k_cache.shape[1]
    slots = slot_mapping.to(device=k.device, dtype=torch.long)
    valid = slots >= 0
    if not bool(valid.all()):
        idx = valid.nonzero().squeeze(1)
        slots, k, v = slots[idx], k[idx], v[idx]
    blocks = torch.div(slots, block_size, rounding_mode="floor")
    offsets = slots - blocks * block_size
    k_cache[blocks, offsets] = k.to(k_cache.dtype)
    v_cache[blocks, offsets] = v.to(v_cache.dtype)


# --------------------------------------------------------------------------- attention


def _gather_kv(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """The first ``length`` tokens of one sequence as [length, KVH, D]."""
    block_size = cache.shape[1]
    n_blocks = (length + block_size - 1) // block_size
    blocks = block_table[:n_blocks].to(device=cache.device, dtype=torch.long)
    return cache[blocks].reshape(n_blocks * block_size, *cache.shape[2:])[:length]


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """q [Lq, H, D], k/v [Lk, KVH, D], mask [Lq, Lk] (True = attend) -> [Lq, H, D] (acc dtype).

    Rows with nothing to attend to give zeros.
    """
    acc = _acc_dtype(q.dtype)
    lq, h, d = q.shape
    kvh = k.shape[1]
    g = h // kvh
    qf = q.to(acc).reshape(lq, kvh, g, d).permute(1, 2, 0, 3)  # [KVH, G, Lq, D]
    kf = k.to(acc).permute(1, 0, 2)  # [KVH, Lk, D]
    vf = v.to(acc).permute(1, 0, 2)
    scores = torch.matmul(qf, kf.unsqueeze(1).transpose(-1, -2)) * scale  # [KVH, G, Lq, Lk]
    scores = scores.masked_fill(~mask, float("-inf"))
    row_max = scores.amax(dim=-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    p = torch.exp(scores - row_max)
    denom = p.sum(dim=-1, keepdim=True)
    out = torch.matmul(p, vf.unsqueeze(1)) / torch.where(denom > 0, denom, torch.ones_like(denom))
    return out.permute(2, 0, 1, 3).reshape(lq, h, d)


def paged_attention_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    *,
    sliding_window: int | None = None,
    max_context_len: int | None = None,
) -> torch.Tensor:
    """One query token per sequence over its ``context_lens[b]`` cached tokens.

    q [B, H, D]; caches [num_blocks, block_size, KVH, D]; block_tables int [B, max_blocks];
    context_lens int [B] (includes the current token). A sequence with context length 0
    (batch padding) gets zeros. ``max_context_len`` is a planning hint for the Triton
    kernel and is ignored here.
    """
    del max_context_len
    b_sz, h, d = q.shape
    if out is None:
        out = torch.empty_like(q)
    if b_sz == 0:
        return out
    lens = context_lens.to("cpu", torch.long)
    max_len = int(lens.max())
    if max_len == 0:
        out.zero_()
        return out
    block_size = k_cache.shape[1]
    n_blocks = (max_len + block_size - 1) // block_size
    table = block_tables[:, :n_blocks].to(device=k_cache.device, dtype=torch.long)
    table = table.clamp(0, k_cache.shape[0] - 1)  # entries past a sequence's end may be junk
    kvh = k_cache.shape[2]
    acc = _acc_dtype(q.dtype)
    k = k_cache[table].reshape(b_sz, n_blocks * block_size, kvh, d)[:, :max_len].to(acc)
    v = v_cache[table].reshape(b_sz, n_blocks * block_size, kvh, d)[:, :max_len].to(acc)
    pos = torch.arange(max_len, device=q.device)
    lens_d = lens.to(q.device)
    mask = pos[None, :] < lens_d[:, None]  # [B, L]
    if sliding_window is not None and sliding_window > 0:
        mask &= pos[None, :] > (lens_d[:, None] - 1 - sliding_window)
    g = h // kvh
    qf = q.to(acc).reshape(b_sz, kvh, g, d)
    scores = torch.einsum("bkgd,blkd->bkgl", qf, k) * scale
    scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
    row_max = scores.amax(dim=-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    p = torch.exp(scores - row_max)
    denom = p.sum(dim=-1, keepdim=True)
    o = torch.einsum("bkgl,blkd->bkgd", p, v) / torch.where(denom > 0, denom, torch.ones_like(denom))
    out.copy_(o.reshape(b_sz, h, d))
    return out


def paged_attention_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    *,
    sliding_window: int | None = None,
    max_seqlen_q: int | None = None,
) -> torch.Tensor:
    """Causal attention for new tokens of variable-length sequences over the paged cache.

    Sequence ``b`` owns query rows ``cu_seqlens_q[b]:cu_seqlens_q[b+1]``; its total KV
    length ``context_lens[b]`` already includes those tokens, so query ``i`` sits at
    position ``context_lens[b] - q_len + i`` and attends to every cached position up to
    and including its own.
    """
    del max_seqlen_q
    if out is None:
        out = torch.empty_like(q)
    cu = cu_seqlens_q.to("cpu", torch.long).tolist()
    lens = context_lens.to("cpu", torch.long).tolist()
    for b in range(len(lens)):
        s, e = cu[b], cu[b + 1]
        q_len, ctx = e - s, lens[b]
        if q_len == 0:
            continue
        if ctx < q_len:
            raise ValueError(f"sequence {b}: context_lens ({ctx}) < number of new tokens ({q_len})")
        k = _gather_kv(k_cache, block_tables[b], ctx)
        v = _gather_kv(v_cache, block_tables[b], ctx)
        q_pos = torch.arange(ctx - q_len, ctx, device=q.device)
        kv_pos = torch.arange(ctx, device=q.device)
        mask = kv_pos[None, :] <= q_pos[:, None]
        if sliding_window is not None and sliding_window > 0:
            mask &= kv_pos[None, :] > (q_pos[:, None] - sliding_window)
        out[s:e] = _attend(q[s:e], k, v, mask, scale).to(out.dtype)
    return out


# --------------------------------------------------------------------------- norms / activations


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
    residual_out: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm over the last dimension, optionally after adding ``residual``.

    Matches Hugging Face's LlamaRMSNorm rounding: the sum ``x + residual`` is rounded to
    the input dtype (it is the new residual stream), the normalization runs in float32 on
    that rounded sum, the normalized value is rounded to the input dtype and then scaled
    by ``weight``.
    Returns ``normed`` or ``(normed, x + residual)``.
    """
    acc = _acc_dtype(x.dtype)
    if residual is not None:
        s = (x.to(acc) + residual.to(acc)).to(x.dtype)
        if residual_out is None:
            residual_out = s
        else:
            residual_out.copy_(s)
        h = s.to(acc)
    else:
        h = x.to(acc)
    var = h.pow(2).mean(dim=-1, keepdim=True)
    normed = (h * torch.rsqrt(var + eps)).to(x.dtype)
    y = (normed.to(acc) * weight.to(acc)).to(x.dtype)
    if out is not None:
        out.copy_(y)
        y = out
    if residual is not None:
        return y, residual_out
    return y


def silu_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``silu(x[..., :I]) * x[..., I:]`` for x [..., 2*I], computed in float32."""
    acc = _acc_dtype(x.dtype)
    i = x.shape[-1] // 2
    y = (F.silu(x[..., :i].to(acc)) * x[..., i:].to(acc)).to(x.dtype)
    if out is not None:
        out.copy_(y)
        return out
    return y


# --------------------------------------------------------------------------- rotary


def compute_inv_freq(
    rotary_dim: int, base: float, rope_scaling: dict | None = None, device: torch.device | str | None = None
) -> torch.Tensor:
    """Inverse frequencies [rotary_dim // 2] in float32, as Hugging Face transformers computes them.

    ``rope_scaling``: None / ``{"rope_type": "default"}``, ``{"rope_type": "linear", "factor"}``
    or ``{"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
    "original_max_position_embeddings"}`` (the older key ``"type"`` is accepted too).
    """
    if rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(f"rotary dimension must be a positive even number, got {rotary_dim}")
    rope_type = "default"
    if rope_scaling:
        rope_type = rope_scaling.get("rope_type", rope_scaling.get("type", "default")) or "default"
    dim = rotary_dim
    inv_freq = 1.0 / (
        base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim)
    )
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / float(rope_scaling["factor"])
    if rope_type == "llama3":
        try:
            factor = rope_scaling["factor"]
            low_freq_factor = rope_scaling["low_freq_factor"]
            high_freq_factor = rope_scaling["high_freq_factor"]
            old_context_len = rope_scaling["original_max_position_embeddings"]
        except KeyError as e:
            raise ValueError(f"llama3 rope scaling needs key {e.args[0]!r}") from None
        low_freq_wavelen = old_context_len / low_freq_factor
        high_freq_wavelen = old_context_len / high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
        smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
        is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)
    raise ValueError(f"unsupported rope scaling type {rope_type!r} (supported: default, linear, llama3)")


def compute_cos_sin_cache(
    head_dim: int,
    max_position: int,
    base: float = 10000.0,
    rope_scaling: dict | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The neox-style cache [max_position, head_dim]: cos in the first half, sin in the second.

    The angles are ``position * inv_freq`` in float32 and cos/sin are taken in float32
    before the cast to ``dtype``, exactly as transformers' rotary embedding does.
    (``head_dim`` here is the rotary dimension; pass ``int(head_dim * partial_rotary_factor)``
    for partial rotary.)
    """
    if max_position <= 0:
        raise ValueError(f"max_position must be positive, got {max_position}")
    inv_freq = compute_inv_freq(head_dim, base, rope_scaling, device=device)
    pos = torch.arange(max_position, device=device, dtype=torch.int64).float()
    freqs = pos[:, None] * inv_freq[None, :]
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(dtype)


def rotary_embedding(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor | None,
    cos_sin_cache: torch.Tensor,
    inplace: bool = False,
    *,
    q_out: torch.Tensor | None = None,
    k_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Neox-style rotary embedding of q [T, H, D] and k [T, KVH, D] at ``positions`` [T].

    The cache row is [cos | sin] of width ``rot`` <= D; dims past ``rot`` pass through.
    Computed in float32, rounded once.
    """
    rot = cos_sin_cache.shape[-1]
    half = rot // 2
    cs = cos_sin_cache.index_select(0, positions.to(device=cos_sin_cache.device, dtype=torch.long))
    results = []
    for x, dst in ((q, q_out), (k, k_out)):
        if x is None:
            results.append(None)
            continue
        acc = _acc_dtype(x.dtype)
        cos = cs[:, None, :half].to(device=x.device, dtype=acc)
        sin = cs[:, None, half:rot].to(device=x.device, dtype=acc)
        x1 = x[..., :half].to(acc)
        x2 = x[..., half:rot].to(acc)
        rotated = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
        if inplace:
            x[..., :rot] = rotated
            results.append(x)
            continue
        y = dst if dst is not None else torch.empty_like(x, memory_format=torch.contiguous_format)
        y[..., :rot] = rotated
        if rot < x.shape[-1]:
            y[..., rot:] = x[..., rot:]
        results.append(y)
    return results[0], results[1]


# --------------------------------------------------------------------------- quantization


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel INT8: w [N, K] -> (qweight int8 [N, K], scales float32 [N]).

    ``w ~= qweight * scales[:, None]``, ``qweight`` in [-127, 127].
    """
    wf = w.to(torch.float32)
    amax = wf.abs().amax(dim=1)
    scales = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    q = torch.round(wf / scales[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scales


def dequantize_int8(qweight: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (qweight.to(torch.float32) * scales.to(torch.float32)[:, None]).to(dtype)


def int4_range_params(wmin: torch.Tensor, wmax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """INT4 ``(scale, zero)`` (float32, the zero an integer in [0, 15]) of groups spanning ``[wmin, wmax]``.

    The range is widened to include 0, ``scale = (max - min) / 15`` (1 for an all-zero group) and
    ``zero = round(-min / scale)``.
    """
    wmin = wmin.clamp(max=0.0)
    wmax = wmax.clamp(min=0.0)
    scales = (wmax - wmin) / 15.0
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    return scales, torch.round(-wmin / scales).clamp_(0, 15)


def int4_levels(w: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
    """The 4-bit levels ``clamp(round(w / scale) + zero, 0, 15)`` (float32), scale and zero broadcast against w."""
    return (torch.round(w / scales) + zeros).clamp_(0, 15)


def pack_int4(q: torch.Tensor, group_size: int = 128) -> torch.Tensor:
    """Levels ``[N, K]`` (any dtype, values in [0, 15]) -> packed uint8 ``[N, K/2]`` (see :func:`quantize_int4`)."""
    n, kdim = q.shape
    g = group_size
    q = q.to(torch.uint8).reshape(n, kdim // g, g)
    lo, hi = q[..., : g // 2], q[..., g // 2 :]
    return (lo | (hi << 4)).reshape(n, kdim // 2)


def quantize_int4(
    w: torch.Tensor, group_size: int = 128
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric group-wise INT4 along K: w [N, K] -> (packed uint8 [N, K/2], scales float32
    [N, K/G], zeros uint8 [N, K/G]).

    Each group's range is widened to include 0, ``scale = (max - min) / 15``,
    ``zero = round(-min / scale)``, ``q = clamp(round(w / scale) + zero, 0, 15)`` and
    ``w ~= (q - zero) * scale`` (round to nearest over the group's min/max range).

    Packing: within each group of G columns, byte ``i`` (``0 <= i < G/2``) holds column
    ``i`` in its low nibble and column ``i + G/2`` in its high nibble (so a kernel reads a
    group as two contiguous halves).
    """
    n, kdim = w.shape
    g = group_size
    wf = w.to(torch.float32).reshape(n, kdim // g, g)
    scales, zeros = int4_range_params(wf.amin(dim=2), wf.amax(dim=2))
    q = int4_levels(wf, scales[..., None], zeros[..., None])
    return pack_int4(q.reshape(n, kdim), g), scales, zeros.to(torch.uint8)


def unpack_int4(packed: torch.Tensor, group_size: int = 128) -> torch.Tensor:
    """packed uint8 [N, K/2] -> the 4-bit values as uint8 [N, K] (see :func:`quantize_int4`)."""
    n, half_k = packed.shape
    g = group_size
    p = packed.reshape(n, (2 * half_k) // g, g // 2)
    lo = p & 0x0F
    hi = p >> 4
    return torch.cat([lo, hi], dim=2).reshape(n, 2 * half_k)


def dequantize_int4(
    packed: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int = 128,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    n = packed.shape[0]
    q = unpack_int4(packed, group_size).to(torch.float32).reshape(n, -1, group_size)
    w = (q - zeros.to(torch.float32)[..., None]) * scales.to(torch.float32)[..., None]
    return w.reshape(n, -1).to(dtype)


def int8_matmul(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """W8A16: ``x @ dequantize_int8(qweight, scales).T (+ bias)`` in float32, cast to x.dtype."""
    acc = _acc_dtype(x.dtype)
    y = (x.to(acc) @ qweight.to(acc).t()) * scales.to(acc)
    if bias is not None:
        y = y + bias.to(acc)
    y = y.to(x.dtype)
    if out is not None:
        out.copy_(y)
        return out
    return y


def int4_matmul(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int = 128,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """W4A16: ``x @ dequantize_int4(...).T (+ bias)`` in float32, cast to x.dtype."""
    acc = _acc_dtype(x.dtype)
    w = dequantize_int4(packed, scales, zeros, group_size, dtype=acc)
    y = x.to(acc) @ w.t()
    if bias is not None:
        y = y + bias.to(acc)
    y = y.to(x.dtype)
    if out is not None:
        out.copy_(y)
        return out
    return y


# --------------------------------------------------------------------------- sampling


def top_k_top_p_filter(
    logits: torch.Tensor,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
) -> torch.Tensor:
    """Set logits outside each row's top-k / top-p (nucleus) set to -inf; returns a new tensor.

    ``top_k`` int [B]: values <= 0 or >= V disable it for that row; ties with the k-th
    largest value are kept. ``top_p`` float [B] in (0, 1]: keeps the smallest set of
    largest-probability tokens whose probability sums to at least p (after top-k); 1.0
    disables it. At least one token always survives.
    """
    if top_k is None and top_p is None:
        return logits.clone()
    vocab = logits.shape[-1]
    sorted_logits, idx = logits.sort(dim=-1, descending=False)
    if top_k is not None:
        k = top_k.to(device=logits.device, dtype=torch.long)
        k = torch.where((k <= 0) | (k > vocab), torch.full_like(k, vocab), k)
        thresh = sorted_logits.gather(1, (vocab - k).unsqueeze(1))
        sorted_logits = sorted_logits.masked_fill(sorted_logits < thresh, float("-inf"))
    if top_p is not None:
        p = top_p.to(device=logits.device, dtype=torch.float32)
        probs = sorted_logits.to(torch.float32).softmax(dim=-1)
        cum = probs.cumsum(dim=-1)
        drop = cum <= (1.0 - p).unsqueeze(1)
        drop[:, -1] = False
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, idx, sorted_logits)


# --------------------------------------------------------------------------- mixture of experts


class ExpertWeights(NamedTuple):
    """One projection of every expert, stacked: float ``[E, N, K]``; INT8 ``[E, N, K]`` int8 with ``scales [E, N]``;
    INT4 packed uint8 ``[E, N, K/2]`` with ``scales`` float32 and ``zeros`` uint8 ``[E, N, K/G]`` (each expert in
    the layout of :mod:`hetero_infer.kernels.quant`)."""

    weight: torch.Tensor
    scales: torch.Tensor | None = None
    zeros: torch.Tensor | None = None
    group_size: int = 0

    @property
    def method(self) -> str:
        return {torch.int8: "int8", torch.uint8: "int4"}.get(self.weight.dtype, "float")

    @property
    def shape(self) -> tuple[int, int, int]:
        """(experts, N, K)"""
        e, n, k = self.weight.shape
        return e, n, 2 * k if self.method == "int4" else k

    def dequantized(self, experts: torch.Tensor | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weights of ``experts`` (indices; None: all) as ``dtype`` ``[len(experts), N, K]``."""
        pick = (lambda t: t) if experts is None else (lambda t: t.index_select(0, experts))
        w = pick(self.weight)
        if self.method == "float":
            return w.to(dtype)
        e, n = w.shape[:2]
        if self.method == "int8":
            return dequantize_int8(w.reshape(e * n, -1), pick(self.scales).reshape(e * n), dtype).reshape(e, n, -1)
        flat = dequantize_int4(w.reshape(e * n, -1), pick(self.scales).reshape(e * n, -1),
                               pick(self.zeros).reshape(e * n, -1), self.group_size, dtype)
        return flat.reshape(e, n, -1)


def moe_routing(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over the experts (float32), the ``top_k`` most likely, renormalised to sum to 1 or not:
    (weights float32 ``[T, top_k]``, expert ids int32 ``[T, top_k]``), as transformers' Qwen3-MoE and Mixtral."""
    probs = torch.softmax(router_logits.to(_acc_dtype(router_logits.dtype)), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)


def fused_moe(
    x: torch.Tensor, w1: ExpertWeights, w2: ExpertWeights, topk_weights: torch.Tensor, topk_ids: torch.Tensor
) -> torch.Tensor:
    """``sum_j topk_weights[t, j] * down_e(silu(gate_e(x_t)) * up_e(x_t))`` with ``e = topk_ids[t, j]``, ``w1`` the
    experts' fused gate|up ``[E, 2I, H]`` and ``w2`` their down projections ``[E, H, I]``.

    Each (token, expert) pair with its own gathered weights; rounded to x's dtype where the kernels round (after
    the gate|up product and after the activation), the weighted sum over the experts in float32, rounded once.
    """
    acc = _acc_dtype(x.dtype)
    t, k = topk_ids.shape
    flat = topk_ids.reshape(-1).long()
    xs = x.to(acc).repeat_interleave(k, dim=0)  # [T*k, H], token-major
    h = torch.bmm(w1.dequantized(flat, acc), xs[:, :, None])[:, :, 0].to(x.dtype)
    a = silu_and_mul(h).to(acc)
    y = torch.bmm(w2.dequantized(flat, acc), a[:, :, None])[:, :, 0]
    y = y * topk_weights.reshape(-1, 1).to(acc)
    return y.reshape(t, k, -1).sum(dim=1).to(x.dtype)


def lora_shrink(x: torch.Tensor, a: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``y[t] = a[slots[t]] @ x[t]`` (``[T, K]`` in x's dtype), zero where ``slots[t] < 0``: every token with its
    own gathered adapter weights."""
    acc = _acc_dtype(x.dtype)
    idx = slots.long()
    gathered = a.index_select(0, idx.clamp(min=0)).to(acc)  # [T, K, in]
    y = torch.einsum("tki,ti->tk", gathered, x.to(acc)) * (idx >= 0).to(acc)[:, None]
    return y.to(x.dtype)


def lora_expand(y: torch.Tensor, b: torch.Tensor, slots: torch.Tensor, out: torch.Tensor,
                slices: tuple[int, ...] | None = None) -> torch.Tensor:
    """``out[t, j] += b[slots[t], j] @ y[t, i*R:(i+1)*R]`` where ``slots[t] >= 0``, row j in output slice i of
    `slices` (their sizes, in order; None: one slice), ``R = b.shape[2]`` (in place; float32 sums, rounded once)."""
    acc = _acc_dtype(out.dtype)
    idx = slots.long()
    sizes = slices or (b.shape[1],)
    r = b.shape[2]
    row_slice = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes)).to(y.device)
    y_rows = y.view(y.shape[0], len(sizes), r).to(acc).index_select(1, row_slice)  # [T, N, R]
    gathered = b.index_select(0, idx.clamp(min=0)).to(acc)  # [T, N, R]
    delta = (gathered * y_rows).sum(-1) * (idx >= 0).to(acc)[:, None]
    out.copy_((out.to(acc) + delta).to(out.dtype))
    return out

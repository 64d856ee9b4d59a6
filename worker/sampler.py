"""Batched token sampler: penalties, min_tokens, temperature, top-k/top-p/min-p, logprobs.

Processing order follows vLLM: penalties -> min_tokens -> temperature -> top-k -> top-p ->
min-p -> sample. Random rows use the exponential race (argmax of probs / Exp(1) noise), so
a seeded row's token depends only on its own logits and generator, never on the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from hetero_infer.worker.sampling_params import SamplingParams

_MASK64 = (1 << 64) - 1
# Width of the first top-k pass used to find top-p nuclei; rows whose nucleus is wider
# retry with a wider pass (x8 each time, up to a full sort).
_CANDIDATES = 256


@dataclass
class SamplingRow:
    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    # Set when the request has a seed (see make_generator); None -> global RNG.
    generator: torch.Generator | None = None
    # Masked while len(output_token_ids) < params.min_tokens (unless ignore_eos).
    eos_token_ids: list[int] = field(default_factory=list)


@dataclass
class SampledToken:
    token_id: int
    # Chosen token's logprob under the raw (unprocessed) distribution; None only from a
    # Sampler(all_logprobs=False) for rows whose params.logprobs is unset.
    logprob: float | None
    # When params.logprobs is set: the top-N raw logprobs plus the chosen token's.
    top_logprobs: dict[int, float] | None


def make_generator(seed: int, sample_index: int = 0, device: torch.device | str = "cpu") -> torch.Generator:
    """Generator for sample `sample_index` of a seeded request.

    Index 0 uses the seed as is; other indices get a splitmix64 mix of (seed, index) so
    samples of one request differ, stay reproducible and do not collide with seed + 1.
    """
    value = seed & _MASK64
    if sample_index:
        z = (value + 0x9E3779B97F4A7C15 * (sample_index + 1)) & _MASK64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        value = z ^ (z >> 31)
    gen = torch.Generator(device=device)
    gen.manual_seed(value)
    return gen


def _seeded_noise(gen: torch.Generator, vocab: int, device: torch.device) -> torch.Tensor:
    """Exp(1) noise over the whole vocab: the per-request reproducible recipe."""
    noise = torch.empty(vocab, device=gen.device).exponential_(generator=gen)
    return noise.to(device)


class Sampler:
    """Stateless batched sampler.

    all_logprobs=True (default) fills SampledToken.logprob for every row (a log-softmax
    over the batch each step); with False only rows whose params.logprobs is set get one
    and the others get None, which keeps the all-greedy path to a single argmax.
    """

    def __init__(self, all_logprobs: bool = True) -> None:
        self.all_logprobs = all_logprobs

    def __call__(self, logits: torch.Tensor, rows: list[SamplingRow]) -> list[SampledToken]:
        if logits.dim() != 2 or logits.shape[0] != len(rows):
            raise ValueError(f"logits must be [len(rows), vocab], got {tuple(logits.shape)} for {len(rows)} rows")
        num_rows, vocab = logits.shape
        device = logits.device
        raw = logits.float()

        x = process_logits(raw, rows)
        tokens = torch.empty(num_rows, dtype=torch.long, device=device)
        greedy = [i for i, r in enumerate(rows) if r.params.greedy]
        if greedy:
            tokens[_index(greedy, device)] = _take_rows(x, greedy).max(dim=-1).indices
        filtered = [i for i, r in enumerate(rows) if not r.params.greedy and _has_top_k_or_p(r.params, vocab)]
        plain = [i for i, r in enumerate(rows) if not r.params.greedy and not _has_top_k_or_p(r.params, vocab)]
        if filtered:
            tokens[_index(filtered, device)] = _sample_filtered(x, rows, filtered)
        if plain:
            tokens[_index(plain, device)] = _sample_plain(x, rows, plain)

        return _collect(raw, tokens, rows, self.all_logprobs)


def process_logits(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """Penalties, then min_tokens masking, as float32.

    Returns `logits` itself when no row needs either, else a new tensor (never in place).
    """
    x = logits.float()
    pen_rows = [i for i, r in enumerate(rows) if _has_penalties(r.params)]
    min_tok_rows = [i for i, r in enumerate(rows) if len(r.output_token_ids) < r.params.min_tokens]
    if not pen_rows and not min_tok_rows:
        return x
    if x is logits:
        x = x.clone()
    if pen_rows:
        _apply_penalties(x, [rows[i] for i in pen_rows], pen_rows)
    if min_tok_rows:
        _mask_stop_tokens(x, [rows[i] for i in min_tok_rows], min_tok_rows)
    return x


def _has_penalties(p: SamplingParams) -> bool:
    return p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0


def _has_top_k_or_p(p: SamplingParams, vocab: int) -> bool:
    return 0 < p.top_k < vocab or p.top_p < 1.0


def _index(idx: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(idx, dtype=torch.long, device=device)


def _take_rows(x: torch.Tensor, idx: list[int]) -> torch.Tensor:
    """x[idx], without a copy when idx is every row in order."""
    if len(idx) == x.shape[0] and idx == list(range(len(idx))):
        return x
    return x.index_select(0, _index(idx, x.device))


def _column(values: list[float], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, device=device).unsqueeze(1)


def _apply_penalties(x: torch.Tensor, rows: list[SamplingRow], idx: list[int]) -> None:
    """Repetition (prompt+output, HF style), then frequency and presence (output, OpenAI style)."""
    device = x.device
    sub = x.index_select(0, _index(idx, device))
    counts = torch.zeros_like(sub)
    out_rows = [j for j, r in enumerate(rows) for _ in r.output_token_ids]
    out_ids = [t for r in rows for t in r.output_token_ids]
    if out_ids:
        counts.index_put_(
            (_index(out_rows, device), _index(out_ids, device)),
            torch.ones(len(out_ids), device=device),
            accumulate=True,
        )
    output_seen = counts > 0

    rep = [r.params.repetition_penalty for r in rows]
    if any(v != 1.0 for v in rep):
        seen = output_seen.clone()
        prompt_rows = [j for j, r in enumerate(rows) for _ in r.prompt_token_ids]
        prompt_ids = [t for r in rows for t in r.prompt_token_ids]
        if prompt_ids:
            seen[_index(prompt_rows, device), _index(prompt_ids, device)] = True
        rep_col = _column(rep, device)
        penalized = torch.where(sub > 0, sub / rep_col, sub * rep_col)
        sub = torch.where(seen, penalized, sub)
    freq = [r.params.frequency_penalty for r in rows]
    if any(freq):
        sub -= _column(freq, device) * counts
    presence = [r.params.presence_penalty for r in rows]
    if any(presence):
        sub -= _column(presence, device) * output_seen
    x[_index(idx, device)] = sub


def _mask_stop_tokens(x: torch.Tensor, rows: list[SamplingRow], idx: list[int]) -> None:
    vocab = x.shape[1]
    pairs = []
    for i, row in zip(idx, rows, strict=True):
        banned = set(row.params.stop_token_ids or [])
        if not row.params.ignore_eos:
            banned.update(row.eos_token_ids)
        pairs.extend((i, t) for t in banned if 0 <= t < vocab)
    if pairs:
        r, t = zip(*pairs, strict=True)
        x[_index(list(r), x.device), _index(list(t), x.device)] = float("-inf")


def _seeded_last(rows: list[SamplingRow], idx: list[int]) -> list[int]:
    """Unseeded rows first so their noise is one contiguous batched draw."""
    return [i for i in idx if rows[i].generator is None] + [i for i in idx if rows[i].generator is not None]


def _unseeded_noise(shape: tuple[int, int], device: torch.device) -> torch.Tensor:
    # -log(U) is Exp(1) and on CPU is ~3x faster than Tensor.exponential_.
    return torch.rand(shape, device=device).log_().neg_()


def _sample_plain(x: torch.Tensor, rows: list[SamplingRow], idx: list[int]) -> torch.Tensor:
    """Temperature (+ min-p) over the whole vocab; returns tokens in the order of idx."""
    order = _seeded_last(rows, idx)
    device, vocab = x.device, x.shape[1]
    sub = _take_rows(x, order)
    inv_t = _column([1.0 / rows[i].params.temperature for i in order], device)
    row_max = sub.amax(dim=-1, keepdim=True)
    # exp((x - max) / T): probabilities relative to the most likely token.
    rel = torch.addcmul(-row_max * inv_t, sub, inv_t).exp_()
    min_p = [rows[i].params.min_p for i in order]
    if any(min_p):
        rel.masked_fill_(rel < _column(min_p, device), 0.0)

    noise = torch.empty_like(rel)
    n_unseeded = sum(rows[i].generator is None for i in order)
    if n_unseeded:
        noise[:n_unseeded] = _unseeded_noise((n_unseeded, vocab), device)
    for j in range(n_unseeded, len(order)):
        noise[j] = _seeded_noise(rows[order[j]].generator, vocab, device)
    chosen = rel.div_(noise).max(dim=-1).indices
    return _reorder(chosen, order, idx)


def _reorder(values: torch.Tensor, order: list[int], idx: list[int]) -> torch.Tensor:
    if order == idx:
        return values
    pos = {row: j for j, row in enumerate(order)}
    return values[_index([pos[i] for i in idx], values.device)]


def _sample_filtered(x: torch.Tensor, rows: list[SamplingRow], idx: list[int]) -> torch.Tensor:
    """Rows with top-k and/or top-p: sample among the top candidates only."""
    vocab = x.shape[1]
    out = torch.empty(len(idx), dtype=torch.long, device=x.device)
    pos = {row: j for j, row in enumerate(idx)}
    pending = idx
    width = max([_CANDIDATES] + [rows[i].params.top_k for i in idx if 0 < rows[i].params.top_k < vocab])
    # Drawn once: a retry with a wider pass must reuse the same noise.
    seeded = {i: _seeded_noise(rows[i].generator, vocab, x.device) for i in idx if rows[i].generator is not None}
    while pending:
        width = min(width, vocab)
        chosen, overflow = _sample_candidates(x, rows, pending, width, seeded)
        done = [i for i in pending if i not in overflow]
        if done:
            keep = [j for j, i in enumerate(pending) if i not in overflow]
            out[_index([pos[i] for i in done], x.device)] = chosen[_index(keep, x.device)]
        pending = [i for i in pending if i in overflow]
        width *= 8
    return out


def _sample_candidates(
    x: torch.Tensor, rows: list[SamplingRow], idx: list[int], width: int, seeded: dict[int, torch.Tensor]
) -> tuple[torch.Tensor, set[int]]:
    """Filter and sample within the `width` largest logits of each row.

    Returns tokens for idx (entries of overflow rows are garbage) and the set of rows whose
    top-p nucleus may extend past `width` and must be retried wider.
    """
    device, vocab = x.device, x.shape[1]
    params = [rows[i].params for i in idx]
    sub = _take_rows(x, idx)
    vals, cand = sub.topk(width, dim=-1, sorted=True)
    inv_t = _column([1.0 / p.temperature for p in params], device)
    rel = (vals - vals[:, :1]).mul_(inv_t).exp_()  # probs relative to the most likely token
    col = torch.arange(width, device=device).unsqueeze(0)
    k = torch.tensor([p.top_k if 0 < p.top_k < vocab else width for p in params], device=device)
    keep = col < k.unsqueeze(1)

    top_p = [p.top_p for p in params]
    overflow: set[int] = set()
    if any(v < 1.0 for v in top_p):
        cums = rel.masked_fill(~keep, 0.0).cumsum(dim=-1)
        # Normaliser: the kept top-k mass, or the whole row's mass when top-k is off.
        total = cums.gather(1, (k - 1).clamp(max=width - 1).unsqueeze(1))
        no_k = [j for j, p in enumerate(params) if not 0 < p.top_k < vocab]
        if no_k and width < vocab:
            no_k_t = _index(no_k, device)
            row_max = vals[no_k_t, :1]
            scale = inv_t[no_k_t]
            full = torch.addcmul(-row_max * scale, _take_rows(sub, no_k), scale).exp_().sum(-1, keepdim=True)
            total[no_k_t] = full
        limit = _column(top_p, device) * total
        exclusive = torch.cat([torch.zeros_like(cums[:, :1]), cums[:, :-1]], dim=1)
        keep &= exclusive < limit
        if width < vocab:
            short = (cums[:, -1:] < limit).squeeze(1).tolist()
            overflow = {idx[j] for j in no_k if short[j]}
    min_p = [p.min_p for p in params]
    if any(min_p):
        keep &= rel >= _column(min_p, device)

    noise = torch.empty_like(rel)
    unseeded = [j for j, i in enumerate(idx) if i not in seeded]
    if unseeded:
        noise[_index(unseeded, device)] = _unseeded_noise((len(unseeded), width), device)
    for j, i in enumerate(idx):
        if i in seeded:
            # The full-vocab draw gathered at the candidates: the same race as over the whole vocab.
            noise[j] = seeded[i][cand[j]]
    pos = rel.masked_fill_(~keep, 0.0).div_(noise).max(dim=-1).indices
    return cand.gather(1, pos.unsqueeze(1)).squeeze(1), overflow


def _collect(
    raw: torch.Tensor, tokens: torch.Tensor, rows: list[SamplingRow], all_logprobs: bool
) -> list[SampledToken]:
    device = raw.device
    token_list = tokens.tolist()
    want = [i for i, r in enumerate(rows) if all_logprobs or r.params.logprobs is not None]
    if not want:
        return [SampledToken(t, None, None) for t in token_list]

    sub = _take_rows(raw, want)
    lse = torch.logsumexp(sub, dim=-1, keepdim=True)
    chosen = (sub.gather(1, tokens[_index(want, device)].unsqueeze(1)) - lse).squeeze(1).tolist()
    top_n = max((rows[i].params.logprobs or 0) for i in want)
    top_vals: list[list[float]] = [[] for _ in want]
    top_ids: list[list[int]] = [[] for _ in want]
    if top_n:
        vals, ids = sub.topk(min(top_n, sub.shape[1]), dim=-1)
        top_vals, top_ids = (vals - lse).tolist(), ids.tolist()

    result = [SampledToken(t, None, None) for t in token_list]
    for j, i in enumerate(want):
        n = rows[i].params.logprobs
        top = None
        if n is not None:
            top = dict(zip(top_ids[j][:n], top_vals[j][:n], strict=True))
            top[token_list[i]] = chosen[j]
        result[i] = SampledToken(token_list[i], chosen[j], top)
    return result

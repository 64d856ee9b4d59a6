"""Batched token sampler: penalties, min_tokens, logit_bias, grammar masks, temperature, top-k/top-p/min-p,
logprobs.

Processing order follows vLLM: penalties -> min_tokens -> logit_bias -> structured-output mask ->
temperature -> top-k -> top-p -> min-p -> sample. Random rows use the exponential race (argmax of probs / Exp(1) noise), so
a seeded row's token depends only on its own logits and generator, never on the batch.
Every step without a grammar row or a logits processor (`samples_on_device`) is sampled by
`Sampler.sample_on_device` with the same code and nothing read back to the host: penalties, min_tokens,
logit_bias and logprobs included, so a CUDA step keeps its tokens (and logprobs) on the device until the step's
one device-to-host copy (`StepSample.pack`).

What a step's sampling reads from the host (row indices, parameter columns, penalty, min_tokens and logit_bias
keys) is built before any of its device work, all at once, by worker/runner/sampling_inputs.py; this module is
the device work that reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from hetero_infer.contracts.sampling_params import SamplingParams
from hetero_infer.contracts.step import PLACEHOLDER, SamplingRow, StepPlan, sample_seed
from hetero_infer.worker.runner.sampling_inputs import (
    FilteredInputs,
    PassInputs,
    PlainInputs,
    ProcessingInputs,
    Rows,
    SamplerInputs,
    SamplingInputs,
    has_penalties,
    pass_inputs,
    processing_inputs,
    rows_of,
    sampler_inputs,
)
from hetero_infer.worker.runner.staging import DirectPack, Pack, StagingArea, to_device
from hetero_infer.worker.structured.mask import apply_token_bitmasks
from hetero_infer.worker.structured.matcher import GrammarState


@dataclass
class SampledToken:
    token_id: int
    # Chosen token's logprob under the raw (unprocessed) distribution; None only from a
    # Sampler(all_logprobs=False) for rows whose params.logprobs is unset.
    logprob: float | None
    # When params.logprobs is set: the top-N raw logprobs plus the chosen token's.
    top_logprobs: dict[int, float] | None


@dataclass(slots=True)
class PendingTokens:
    """Tokens a previous step sampled that the host does not have yet (a PLACEHOLDER ends those rows'
    output_token_ids, under the overlap): `tokens` where the logits are, and for each such sampling row its index
    in `tokens`. Penalties count them from there, on the device."""

    tokens: torch.Tensor
    rows: dict[int, int]


def pending_tokens(rows: list[SamplingRow], seq_ids: list[int], tokens: torch.Tensor | None,
                   index_of: dict[int, int]) -> PendingTokens | None:
    """The `PendingTokens` of `rows` (sequence ids `seq_ids`, in order) whose newest output token is a
    PLACEHOLDER, from the previous step's sampled `tokens` (`index_of`: sequence id -> row in them); None if none."""
    late = [(i, seq_id) for i, (row, seq_id) in enumerate(zip(rows, seq_ids, strict=True))
            if row.output_token_ids and row.output_token_ids[-1] == PLACEHOLDER]
    if not late:
        return None
    if tokens is None:
        raise RuntimeError("a step reads tokens of a previous step that this executor did not run")
    return PendingTokens(tokens, {i: index_of[seq_id] for i, seq_id in late})


@dataclass(slots=True)
class StepLogprobs:
    """The raw logprobs a step's rows asked for, where the logits are: for rows `rows` (ascending), the chosen
    token's (`chosen`) and the `width` largest, with their ids; row j keeps its first `top_n[j]` of them (None:
    only the chosen token's, no top dict)."""

    rows: list[int]
    top_n: list[int | None]
    chosen: torch.Tensor  # [len(rows)] float32
    top_values: torch.Tensor  # [len(rows), width] float32
    top_ids: torch.Tensor  # [len(rows), width] int64

    @property
    def width(self) -> int:
        return self.top_values.shape[1]


@dataclass(slots=True)
class StepSample:
    """What `sample_logits` gives for a step: the tokens where the logits are, and either the logprobs asked for,
    also there (the device path), or every row's `SampledToken`, on the host (the host sampler)."""

    tokens: torch.Tensor  # [rows] int64
    logprobs: StepLogprobs | None = None
    sampled: list[SampledToken] | None = None

    def pack(self) -> torch.Tensor:
        """The tokens, then with logprobs each asking row's chosen logprob, top values and top ids, as ONE float64
        tensor where they are (ids < 2**53 and float32 values are exact in float64), for one device-to-host copy;
        `unpack_step` reads it back. Without logprobs: the int64 tokens themselves."""
        lp = self.logprobs
        if lp is None:
            return self.tokens
        return torch.cat([self.tokens.double(), lp.chosen.double(), lp.top_values.double().flatten(),
                          lp.top_ids.double().flatten()])

    def on_host(self) -> tuple[list[int], list[SampledToken] | None]:
        """(token ids, each row's `SampledToken` where any row has logprobs, else None), read back now."""
        if self.sampled is not None:
            return [t.token_id for t in self.sampled], self.sampled
        if self.logprobs is None:
            return self.tokens.tolist(), None
        return unpack_step(self.pack().cpu().numpy(), self.tokens.shape[0], self.logprobs)


def unpack_step(host: np.ndarray, num_rows: int,
                logprobs: StepLogprobs) -> tuple[list[int], list[SampledToken]]:
    """`StepSample.pack`'s float64 layout, read on the host: (token ids, each row's `SampledToken`)."""
    m, w = len(logprobs.rows), logprobs.width
    token_ids = host[:num_rows].astype(np.int64).tolist()
    start = num_rows
    chosen = host[start:start + m].tolist()
    start += m
    values = host[start:start + m * w].reshape(m, w).tolist()
    ids = host[start + m * w:start + 2 * m * w].reshape(m, w).astype(np.int64).tolist()
    sampled = [SampledToken(t, None, None) for t in token_ids]
    for j, i in enumerate(logprobs.rows):
        n = logprobs.top_n[j]
        top = None
        if n is not None:
            top = dict(zip(ids[j][:n], values[j][:n], strict=True))
            top[token_ids[i]] = chosen[j]
        sampled[i] = SampledToken(token_ids[i], chosen[j], top)
    return token_ids, sampled


def make_generator(seed: int, sample_index: int = 0, device: torch.device | str = "cpu") -> torch.Generator:
    """Generator for sample `sample_index` of a seeded request (seeded with `sample_seed(seed, sample_index)`)."""
    return seeded_generator(sample_seed(seed, sample_index), device)


def seeded_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """The generator of a row whose `SamplingRow.seed` is `seed` (already mixed by `sample_seed`)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


class SeededGenerators:
    """An executor's generators of seeded sequences, by seq_id (the step contract carries each row's seed only):
    made at a sequence's first sampled step, kept while it runs (preempted and recomputed too, so its draws go on
    where they were), dropped when the plan says it finished."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = device
        self._by_seq: dict[int, torch.Generator] = {}

    def __len__(self) -> int:
        return len(self._by_seq)

    def attach(self, plan: StepPlan, rows: list[SamplingRow] | None) -> None:
        """Give each seeded row of `plan` its sequence's generator (`rows`: in the order of its sampling rows)."""
        by_seq = self._by_seq
        if by_seq:
            for seq_id in plan.finished_seq_ids:
                by_seq.pop(seq_id, None)
        if rows is None:
            return
        for seq_id, row in zip(plan.sampled_seq_ids, rows, strict=True):
            if row.seed is not None and row.generator is None:
                gen = by_seq.get(seq_id)
                if gen is None:
                    gen = by_seq[seq_id] = seeded_generator(row.seed, self.device)
                row.generator = gen


def _fill_seeded_noise(out: torch.Tensor, gen: torch.Generator) -> None:
    """Fill a 1-D vocab-sized row with the per-request recipe, torch.empty(V).exponential_(generator=gen)."""
    if gen.device == out.device:
        out.exponential_(generator=gen)  # same numbers as a fresh tensor, without the copy
    else:
        out.copy_(torch.empty(out.shape[0], device=gen.device).exponential_(generator=gen))


class Sampler:
    """Stateless batched sampler.

    all_logprobs=True (default) fills SampledToken.logprob for every row (a log-softmax
    over the batch each step); with False only rows whose params.logprobs is set get one
    and the others get None, which keeps the all-greedy path to a single argmax.
    """

    def __init__(self, all_logprobs: bool = True) -> None:
        self.all_logprobs = all_logprobs

    def __call__(self, logits: torch.Tensor, rows: list[SamplingRow],
                 pending: PendingTokens | None = None) -> list[SampledToken]:
        """The host sampler: every row's `SampledToken`, read back (grammar rows included)."""
        if logits.dim() != 2 or logits.shape[0] != len(rows):
            raise ValueError(f"logits must be [len(rows), vocab], got {tuple(logits.shape)} for {len(rows)} rows")
        token_ids, sampled = self._sample(logits, rows, pending, False, None).on_host()
        return sampled if sampled is not None else [SampledToken(t, None, None) for t in token_ids]

    def sample_on_device(self, logits: torch.Tensor, rows: list[SamplingRow], one_pass: bool | None = None,
                         pending: PendingTokens | None = None, staging: StagingArea | None = None) -> StepSample:
        """What `__call__` samples for rows that all `samples_on_device` (penalties, min_tokens, logit_bias and
        logprobs included), as tensors where the logits are, with no host round trip (nothing read back, the
        step's host inputs packed into `staging` and copied at once without blocking; `pending`: tokens of the
        step in flight that penalties count, still on the device). Seeded rows get exactly `__call__`'s tokens, their
        generators advanced alike, and every row its logprobs; unseeded rows draw from the same distribution
        (the global generator's draws have another shape: see `_sample_filtered`).
        `one_pass` (default: off the CPU) ranks top-p rows in one pass, no overflow read back; on the CPU the
        read-back costs nothing and the host's narrow first pass is ~4x cheaper than a full sort at 32 rows.
        `staging`: where the step's host inputs are packed, for one copy (None: each array a tensor of its own,
        on a GPU each copied from pinned memory on its own)."""
        if one_pass is None:
            one_pass = logits.device.type != "cpu"
        return self._sample(logits, rows, pending, one_pass, staging)

    def _sample(self, logits: torch.Tensor, rows: list[SamplingRow], pending: PendingTokens | None, one_pass: bool,
                staging: StagingArea | None) -> StepSample:
        """Every host input of the step packed first (one copy with a staged `staging`), then the device work."""
        vocab = logits.shape[1]

        def fill(pack: Pack | DirectPack) -> SamplerInputs:
            return sampler_inputs(rows, vocab, pending, one_pass, self.all_logprobs, pack)
        inputs = staging.pack(fill) if staging is not None else fill(DirectPack(logits.device))
        raw = logits.float()
        tokens = _sample_tokens(process_logits(raw, rows, pending, inputs.processing), rows, one_pass,
                                inputs.sampling)
        return StepSample(tokens, self._logprobs(raw, tokens, rows, inputs.logprobs))

    @staticmethod
    def _logprobs(raw: torch.Tensor, tokens: torch.Tensor, rows: list[SamplingRow],
                  want: Rows | None) -> StepLogprobs | None:
        """The raw logprobs of the rows `want` (`sampler_inputs`: the rows that asked, or every row with
        all_logprobs), where the logits are."""
        if want is None:
            return None
        sub = want.take(raw)
        lse = torch.logsumexp(sub, dim=-1, keepdim=True)
        chosen = (sub.gather(1, want.take(tokens).unsqueeze(1)) - lse).squeeze(1)
        top_n = [rows[i].params.logprobs for i in want.ids]
        width = min(max(n or 0 for n in top_n), sub.shape[1])
        if width:
            values, ids = sub.topk(width, dim=-1)
            values = values - lse
        else:
            values = sub.new_empty(len(want.ids), 0)
            ids = tokens.new_empty(len(want.ids), 0)
        return StepLogprobs(want.ids, top_n, chosen, values, ids)

    def argmax(self, logits: torch.Tensor) -> list[int]:
        """Each row's token where every row `takes_argmax` (and the sampler fills no logprobs unless asked):
        what `__call__` returns for such rows, in a handful of ops instead of a few dozen (each runs cache-cold
        after a step's weights streamed through the caches)."""
        return self.argmax_tokens(logits).tolist()

    def argmax_tokens(self, logits: torch.Tensor) -> torch.Tensor:
        """`argmax` as a tensor where the logits are (no host round trip on a GPU)."""
        assert not self.all_logprobs, "argmax() leaves out the logprobs a Sampler(all_logprobs=True) fills"
        # off the CPU the 16-bit logits as they are: widening is exact and order-preserving, so the first maximum
        # is the same, without a float32 copy of [rows, vocab] (the CPU's numpy argmax wants float32)
        return _argmax(logits.float() if logits.device.type == "cpu" else logits)


def takes_argmax(params: SamplingParams, num_output_tokens: int, grammar: GrammarState | None) -> bool:
    """True where a row's token is the first maximum of its raw logits and nothing else is computed for it:
    greedy, no logprobs, and nothing `process_logits` applies (penalties, a min_tokens mask, logit_bias, a
    grammar)."""
    return (params.greedy and params.logprobs is None and grammar is None and not params.logit_bias
            and num_output_tokens >= params.min_tokens and not has_penalties(params))


def samples_on_device(row: SamplingRow) -> bool:
    """True where a row is sampled where its logits are (`Sampler.sample_on_device`), nothing read back: every
    row but a grammar's (its token bitmask applied, the host sampler takes the token: the engine's matcher needs it
    before the next step's mask) or one with logits processors (Python callables over its logits row)."""
    return row.token_bitmask is None and not row.params.logits_processors


# -- the device work, reading those inputs ------------------------------------------------------------------------
def process_logits(logits: torch.Tensor, rows: list[SamplingRow], pending: PendingTokens | None = None,
                   inputs: ProcessingInputs | None = None) -> torch.Tensor:
    """Penalties, then min_tokens masking, then logit_bias, then grammar masks, as float32. `pending`: the tokens
    of the step in flight (PLACEHOLDERs in output_token_ids), counted by the penalties where they are.
    `inputs`: the step's host inputs for them (`sampler_inputs`; built here if None).

    Returns `logits` itself when no row needs any, else a new tensor (never in place). Nothing is read back to
    the host but for grammar rows.
    """
    x = logits.float()
    if inputs is None:
        inputs = processing_inputs(rows, x.shape[1], pending, DirectPack(x.device))
    grammar_rows = [i for i, r in enumerate(rows) if r.token_bitmask is not None]
    if not inputs.active and not grammar_rows:
        return x
    if x is logits or not x.is_contiguous():
        x = x.clone(memory_format=torch.contiguous_format)
    _apply_penalties(x, inputs, pending)
    if inputs.stop_keys is not None:
        x.view(-1).index_fill_(0, inputs.stop_keys, float("-inf"))
    if inputs.bias_keys is not None:
        x.view(-1).index_add_(0, inputs.bias_keys, inputs.bias_values)
    if grammar_rows:
        apply_token_bitmasks(x, grammar_rows, [rows[i].token_bitmask for i in grammar_rows])
    return x


def _argmax(x: torch.Tensor) -> torch.Tensor:
    """First index of each row's maximum (a row holding a NaN: its first NaN, as torch's max). On the CPU through
    numpy's vectorized argmax: one thread, so no parallel region to wait for when another process holds a core
    (the C kernel's, or torch's, took ~8 ms at 32 rows then), and a few us of call overhead where a step's
    weights have just left every cache cold (~60 us at one row, against ~260 us for the C kernel's wrapper)."""
    if x.device.type == "cpu" and x.dtype == torch.float32:
        return torch.from_numpy(x.numpy().argmax(-1))
    return x.max(dim=-1).indices


def _sample_tokens(x: torch.Tensor, rows: list[SamplingRow], one_pass: bool, inputs: SamplingInputs) -> torch.Tensor:
    """Each row's token from its processed logits `x`: argmax for greedy rows, else the exponential race over
    its temperature/top-k/top-p/min-p distribution. `one_pass`: see `_sample_filtered`."""
    tokens = torch.empty(x.shape[0], dtype=torch.long, device=x.device)
    if inputs.greedy is not None:
        inputs.greedy.write(tokens, _argmax(inputs.greedy.take(x)))
    if inputs.filtered is not None:
        inputs.filtered_rows.write(tokens, _sample_filtered(x, rows, inputs.filtered_rows.ids, inputs.filtered))
    if inputs.plain is not None:
        inputs.plain.rows.write(tokens, _sample_plain(x, rows, inputs.plain))
    return tokens


def _index(idx: list[int], device: torch.device) -> torch.Tensor:
    return to_device(np.asarray(idx, dtype=np.int64), device)


def _apply_penalties(x: torch.Tensor, inputs: ProcessingInputs, pending: PendingTokens | None) -> None:
    """Repetition (prompt+output, HF style), then frequency and presence (output, OpenAI style).

    Works on the (row, token) pairs that occurred, not on whole rows: flat keys row * V + token, one per
    occurrence. Without a read-back: a key that occurs k times is written k times with the same value, and the
    output's counts come from a sort (`searchsorted` of each key in the sorted keys), not `unique`."""
    vocab = x.shape[1]
    flat = x.view(-1)
    if inputs.repetition is not None:
        keys = inputs.repetition.on_device(pending)
        penalty = inputs.repetition_penalty[keys // vocab]
        vals = flat[keys]
        flat.index_put_((keys,), torch.where(vals > 0, vals / penalty, vals * penalty))
    if inputs.output is not None:
        keys = inputs.output.on_device(pending)
        ordered = keys.sort().values
        counts = torch.searchsorted(ordered, keys, right=True) - torch.searchsorted(ordered, keys)
        row = keys // vocab
        freq = inputs.frequency_penalty[row]
        presence = inputs.presence_penalty[row]
        flat.index_put_((keys,), flat[keys] - (freq * counts + presence))


def _unseeded_noise(shape: tuple[int, int], device: torch.device) -> torch.Tensor:
    # -log(U) is Exp(1) and on CPU is ~3x faster than Tensor.exponential_.
    return torch.rand(shape, device=device).log_().neg_()


def _sample_plain(x: torch.Tensor, rows: list[SamplingRow], inputs: PlainInputs) -> torch.Tensor:
    """Temperature (+ min-p) over the whole vocab; returns tokens in the order of the plain rows."""
    device, vocab = x.device, x.shape[1]
    sub = inputs.rows.take(x)
    inv_t = inputs.inv_t
    row_max = sub.amax(dim=-1, keepdim=True)
    # exp((x - max) / T): probabilities relative to the most likely token.
    rel = torch.addcmul(-row_max * inv_t, sub, inv_t).exp_()
    if inputs.min_p is not None:
        rel.masked_fill_(rel < inputs.min_p, 0.0)
    # One batched draw; seeded rows then overwrite theirs (cheaper than gathering the others).
    noise = _unseeded_noise((len(inputs.rows.ids), vocab), device)
    for j, i in enumerate(inputs.rows.ids):
        if rows[i].generator is not None:
            _fill_seeded_noise(noise[j], rows[i].generator)
    return rel.div_(noise).max(dim=-1).indices


def _sample_filtered(x: torch.Tensor, rows: list[SamplingRow], idx: list[int], inputs: FilteredInputs) -> torch.Tensor:
    """Rows `idx` with top-k and/or top-p: sample among each row's largest logits only. The first pass is as wide
    as `filtered_inputs` made it: with `one_pass`, as wide as the widest nucleus can be (the whole vocab where a
    row has top-p without top-k), so no row's overflow is read back; a wider pass keeps the same tokens (the
    candidates are the same sorted prefix, the seeded noise is the full vocab's) and only the global generator's
    draws change shape. Else the rows whose nucleus may extend past a pass are read back and retried wider."""
    device, vocab = x.device, x.shape[1]
    # Top-p without top-k normalises by the whole row's mass (relative to the row max).
    mass = torch.zeros(len(idx), 1, device=device)
    if inputs.no_k_rows is not None:
        sub = inputs.no_k_rows.take(x)
        scale = inputs.no_k_scale
        row_max = sub.amax(dim=-1, keepdim=True)
        inputs.no_k_pos.write(mass, torch.addcmul(-row_max * scale, sub, scale).exp_().sum(-1, keepdim=True))
    # Drawn once, up front: a retry with a wider pass must reuse the same noise.
    seeded = torch.empty(len(inputs.seeded_pos), vocab, device=device)
    for r, j in enumerate(inputs.seeded_pos):
        _fill_seeded_noise(seeded[r], rows[idx[j]].generator)

    seeded_row = {j: r for r, j in enumerate(inputs.seeded_pos)}
    pos, width = list(range(len(idx))), inputs.width
    out, overflow = _sample_candidates(x, rows, idx, pos, width, mass, seeded, seeded_row, inputs.first)
    while overflow:
        pos, width = [j for j in pos if j in overflow], min(width * 8, vocab)
        tokens, overflow = _sample_candidates(x, rows, idx, pos, width, mass, seeded, seeded_row)
        done = [n for n, j in enumerate(pos) if j not in overflow]
        if done:
            out[_index([pos[n] for n in done], device)] = tokens[_index(done, device)]
    return out


def _sample_candidates(
    x: torch.Tensor,
    rows: list[SamplingRow],
    idx: list[int],
    pos: list[int],
    width: int,
    mass: torch.Tensor,
    seeded: torch.Tensor,
    seeded_row: dict[int, int],
    inputs: PassInputs | None = None,
) -> tuple[torch.Tensor, set[int]]:
    """Filter and sample rows idx[pos] within their `width` largest logits (`inputs`: the pass's host inputs,
    from `pass_inputs`; a retry's are built here, where the host has just read which rows overflowed).

    Returns a token per pos (garbage for overflow) and the positions whose top-p nucleus
    may extend past `width` and must be retried wider.
    """
    device, vocab = x.device, x.shape[1]
    if inputs is None:
        direct = DirectPack(device)
        inputs = pass_inputs(rows, idx, pos, rows_of([idx[j] for j in pos], x.shape[0], direct), width, seeded_row,
                              vocab, direct)
    vals, cand = inputs.rows.take(x).topk(width, dim=-1, sorted=True)
    rel = (vals - vals[:, :1]).mul_(inputs.inv_t).exp_()  # probabilities relative to the most likely token
    k = inputs.k
    keep = torch.arange(width, device=device).unsqueeze(0) < k.unsqueeze(1)

    overflow: set[int] = set()
    if inputs.top_p is not None:
        cums = rel.masked_fill(~keep, 0.0).cumsum(dim=-1)
        total = cums.gather(1, (k - 1).unsqueeze(1))  # mass of the top-k tokens
        if inputs.pos is not None:
            no_k_mass = inputs.pos.take(mass)
            total = no_k_mass if inputs.has_k_col is None else torch.where(inputs.has_k_col, total, no_k_mass)
        limit = inputs.top_p * total
        exclusive = torch.cat([torch.zeros_like(cums[:, :1]), cums[:, :-1]], dim=1)
        keep &= exclusive < limit
        if width < vocab and inputs.pos is not None:  # a top-k row's nucleus is inside its top k
            short = (cums[:, -1] < limit.squeeze(1)).tolist()
            overflow = {j for j, h, sh in zip(pos, inputs.has_k, short, strict=True) if sh and not h}
    if inputs.min_p is not None:
        keep &= rel >= inputs.min_p

    noise = _unseeded_noise((len(pos), width), device)
    if inputs.mine is not None:
        # Full-vocab draws gathered at the candidates: the same race as over the whole vocab.
        inputs.mine.write(noise, inputs.own.take(seeded).gather(1, inputs.mine.take(cand)))
    best = rel.masked_fill_(~keep, 0.0).div_(noise).max(dim=-1).indices
    return cand.gather(1, best.unsqueeze(1)).squeeze(1), overflow


def sample_logits(sampler: Sampler, logits: torch.Tensor, rows: list[SamplingRow] | None,
                  pending: PendingTokens | None = None, staging: StagingArea | None = None) -> StepSample:
    """A step's tokens from its logits, one row per sequence that samples. `rows` None: every row takes the first
    maximum of its logits (`takes_argmax`, the usual all-greedy step). Where every row `samples_on_device`
    (no grammar, no logits processor): `Sampler.sample_on_device`, the tokens and logprobs left where the logits
    are. Else each row's logits processors (on a copy), then the host sampler, which reads its results back:
    the tokens and every row's `SampledToken` on the host. `pending`: see `PendingTokens`. `staging`: where
    `sample_on_device` packs the step's host inputs, for one host-to-device copy."""
    if rows is None:
        return StepSample(sampler.argmax_tokens(logits))
    if all(samples_on_device(r) for r in rows):
        return sampler.sample_on_device(logits, rows, pending=pending, staging=staging)
    if any(r.params.logits_processors for r in rows):
        logits = logits.to(torch.float32, copy=True)  # processors see float32 rows, as in vLLM
        for i, r in enumerate(rows):
            for process in r.params.logits_processors or ():
                logits[i] = process(r.output_token_ids, logits[i])
    sampled = sampler(logits, rows, pending)
    return StepSample(torch.tensor([t.token_id for t in sampled], dtype=torch.long), sampled=sampled)

"""What a step's sampling reads from the host, built before any of its device work, all at once
(`sampler_inputs`), into a pack (worker/runner/staging.py): row indices, temperature/top-k/top-p/min-p columns,
penalty keys row * V + token, logit_bias keys and values, min_tokens masks. The executor's sampling
`StagingArea` takes them to the device with ONE copy from persistent pinned memory; on the CPU (or with no
staging) each array is used where it is. The device work that reads them is worker/runner/sampler.py's.

Host work only: a `Pack` that runs out of room runs the whole build again, larger.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from hetero_infer.contracts.sampling_params import SamplingParams
from hetero_infer.worker.runner.staging import DirectPack, Pack

if TYPE_CHECKING:
    from hetero_infer.worker.runner.sampler import PendingTokens, SamplingRow

# Width of the first top-k pass used to find top-p nuclei; rows whose nucleus is wider
# retry with a wider pass (x8 each time, up to a full sort).
CANDIDATES = 256


@dataclass(slots=True)
class Rows:
    """Some rows of a batch: their indices on the host and where the logits are (`at`; None: every row, in order,
    so nothing is gathered or scattered)."""

    ids: list[int]
    at: torch.Tensor | None

    def take(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.at is None else x.index_select(0, self.at)

    def write(self, out: torch.Tensor, values: torch.Tensor) -> None:
        if self.at is None:
            out.copy_(values)
        else:
            out[self.at] = values


def rows_of(ids: list[int], total: int, pack: Pack | DirectPack) -> Rows:
    """`ids` of a batch of `total` rows as `Rows` (their indices put in `pack` unless they are every row)."""
    return Rows(ids, None if len(ids) == total and ids == list(range(total)) else pack.put(ids))


def column(values: list[float], pack: Pack | DirectPack) -> torch.Tensor:
    return pack.put(values, np.float32).unsqueeze(1)


@dataclass(slots=True)
class Keys:
    """Occurrence keys row * V + token: those the host knows (`host`), and for tokens still pending on the device,
    each such row's index in `PendingTokens.tokens` then its row * V (`late`, [2n])."""

    host: torch.Tensor | None
    late: torch.Tensor | None

    def on_device(self, pending: PendingTokens | None) -> torch.Tensor:
        if self.late is None:
            return self.host
        n = self.late.shape[0] // 2
        late = pending.tokens.index_select(0, self.late[:n]) + self.late[n:]
        return late if self.host is None else torch.cat([self.host, late])


@dataclass(slots=True)
class ProcessingInputs:
    """`process_logits`' host inputs (but the grammar masks'): flat keys row * V + token and what they get."""

    active: bool = False  # some row has penalties, a min_tokens mask or a logit_bias
    repetition: Keys | None = None
    repetition_penalty: torch.Tensor | None = None  # [rows] float32
    output: Keys | None = None
    frequency_penalty: torch.Tensor | None = None  # [rows] float32
    presence_penalty: torch.Tensor | None = None  # [rows] float32
    stop_keys: torch.Tensor | None = None
    bias_keys: torch.Tensor | None = None
    bias_values: torch.Tensor | None = None


@dataclass(slots=True)
class PassInputs:
    """One candidate pass's host inputs, over the filtered rows at positions `pos` (`_sample_candidates`)."""

    rows: Rows  # those rows in the logits
    pos: Rows | None  # the positions (in `mass`), where a row without top-k has top-p
    has_k: list[bool]
    inv_t: torch.Tensor  # [n, 1] float32
    k: torch.Tensor  # [n] int64: top-k, else the pass's width
    has_k_col: torch.Tensor | None  # [n, 1] bool, where some rows have top-k and others top-p alone
    top_p: torch.Tensor | None  # [n, 1] float32, where a row has top-p
    min_p: torch.Tensor | None  # [n, 1] float32, where a row has min-p
    mine: Rows | None  # the positions (in the pass) of seeded rows
    own: Rows | None  # and their rows in the seeded noise


@dataclass(slots=True)
class FilteredInputs:
    """`_sample_filtered`'s host inputs: its rows without top-k (their top-p mass is the whole row's), which of
    them are seeded, and the first pass's width and inputs."""

    no_k_rows: Rows | None
    no_k_pos: Rows | None
    no_k_scale: torch.Tensor | None  # [n, 1] float32
    seeded_pos: list[int]
    width: int
    first: PassInputs


@dataclass(slots=True)
class PlainInputs:
    rows: Rows
    inv_t: torch.Tensor  # [n, 1] float32
    min_p: torch.Tensor | None  # [n, 1] float32, where a row has min-p


@dataclass(slots=True)
class SamplingInputs:
    """`_sample_tokens`' host inputs: greedy, top-k/top-p and plain temperature rows."""

    greedy: Rows | None
    filtered_rows: Rows | None
    filtered: FilteredInputs | None
    plain: PlainInputs | None


@dataclass(slots=True)
class SamplerInputs:
    processing: ProcessingInputs
    sampling: SamplingInputs
    logprobs: Rows | None  # rows that get logprobs


def sampler_inputs(rows: list[SamplingRow], vocab: int, pending: PendingTokens | None, one_pass: bool,
                 all_logprobs: bool, pack: Pack | DirectPack) -> SamplerInputs:
    """Everything a step's sampling reads from the host, put in `pack` (host work only: a `Pack` may run it
    again, larger)."""
    want = [i for i, r in enumerate(rows) if all_logprobs or r.params.logprobs is not None]
    return SamplerInputs(processing_inputs(rows, vocab, pending, pack), sampling_inputs(rows, vocab, one_pass, pack),
                       rows_of(want, len(rows), pack) if want else None)


def processing_inputs(rows: list[SamplingRow], vocab: int, pending: PendingTokens | None,
                       pack: Pack | DirectPack) -> ProcessingInputs:
    pen_rows = [i for i, r in enumerate(rows) if has_penalties(r.params)]
    min_tok_rows = [i for i, r in enumerate(rows) if len(r.output_token_ids) < r.params.min_tokens]
    bias_rows = [i for i, r in enumerate(rows) if r.params.logit_bias]
    out = ProcessingInputs(active=bool(pen_rows or min_tok_rows or bias_rows))
    if pen_rows:
        rep_idx = [i for i in pen_rows if rows[i].params.repetition_penalty != 1.0]
        out.repetition = occurrence_keys(rows, rep_idx, vocab, pending, True, pack)
        if out.repetition is not None:
            out.repetition_penalty = pack.put([r.params.repetition_penalty for r in rows], np.float32)
        out_idx = [i for i in pen_rows if rows[i].params.frequency_penalty or rows[i].params.presence_penalty]
        out.output = occurrence_keys(rows, out_idx, vocab, pending, False, pack)
        if out.output is not None:
            out.frequency_penalty = pack.put([r.params.frequency_penalty for r in rows], np.float32)
            out.presence_penalty = pack.put([r.params.presence_penalty for r in rows], np.float32)
    if min_tok_rows:
        keys = stop_keys(rows, min_tok_rows, vocab)
        if keys:
            out.stop_keys = pack.put(keys)
    if bias_rows:
        keys, values = bias_entries(rows, bias_rows, vocab)
        if keys:
            out.bias_keys, out.bias_values = pack.put(keys), pack.put(values, np.float32)
    return out


def sampling_inputs(rows: list[SamplingRow], vocab: int, one_pass: bool, pack: Pack | DirectPack) -> SamplingInputs:
    n = len(rows)
    greedy = [i for i, r in enumerate(rows) if r.params.greedy]
    filtered = [i for i, r in enumerate(rows) if not r.params.greedy and has_top_k_or_p(r.params, vocab)]
    plain = [i for i, r in enumerate(rows) if not r.params.greedy and not has_top_k_or_p(r.params, vocab)]
    plain_inputs = None
    if plain:
        min_p = [rows[i].params.min_p for i in plain]
        plain_inputs = PlainInputs(rows_of(plain, n, pack), column([1.0 / rows[i].params.temperature for i in plain], pack),
                              column(min_p, pack) if any(min_p) else None)
    filtered_rows = rows_of(filtered, n, pack) if filtered else None
    return SamplingInputs(rows_of(greedy, n, pack) if greedy else None, filtered_rows,
                     filtered_inputs(rows, filtered_rows, vocab, one_pass, pack) if filtered else None, plain_inputs)


def filtered_inputs(rows: list[SamplingRow], filtered: Rows, vocab: int, one_pass: bool,
                     pack: Pack | DirectPack) -> FilteredInputs:
    idx, n = filtered.ids, len(rows)
    params = [rows[i].params for i in idx]
    no_k = [j for j, p in enumerate(params) if not 0 < p.top_k < vocab]
    seeded_pos = [j for j, i in enumerate(idx) if rows[i].generator is not None]
    width = max([CANDIDATES] + [p.top_k for p in params if 0 < p.top_k < vocab])
    if one_pass and no_k and any(params[j].top_p < 1.0 for j in no_k):
        width = vocab
    width = min(width, vocab)
    first = pass_inputs(rows, idx, list(range(len(idx))), filtered, width, {j: r for r, j in enumerate(seeded_pos)},
                         vocab, pack)
    if not no_k:
        return FilteredInputs(None, None, None, seeded_pos, width, first)
    return FilteredInputs(rows_of([idx[j] for j in no_k], n, pack), rows_of(no_k, len(idx), pack),
                     column([1.0 / params[j].temperature for j in no_k], pack), seeded_pos, width, first)


def pass_inputs(rows: list[SamplingRow], idx: list[int], pos: list[int], at: Rows, width: int,
                 seeded_row: dict[int, int], vocab: int, pack: Pack | DirectPack) -> PassInputs:
    """A candidate pass's inputs for the filtered rows idx[pos] (`at`: those rows in the logits)."""
    params = [rows[idx[j]].params for j in pos]
    has_k = [0 < p.top_k < vocab for p in params]
    top_p = [p.top_p for p in params]
    min_p = [p.min_p for p in params]
    nucleus = any(v < 1.0 for v in top_p)
    mixed = nucleus and not all(has_k)
    mine = [n for n, j in enumerate(pos) if j in seeded_row]
    return PassInputs(
        rows=at,
        pos=rows_of(pos, len(idx), pack) if mixed else None,
        has_k=has_k,
        inv_t=column([1.0 / p.temperature for p in params], pack),
        k=pack.put([p.top_k if h else width for p, h in zip(params, has_k, strict=True)]),
        has_k_col=pack.put(has_k, np.bool_).unsqueeze(1) if mixed and any(has_k) else None,
        top_p=column(top_p, pack) if nucleus else None,
        min_p=column(min_p, pack) if any(min_p) else None,
        mine=rows_of(mine, len(pos), pack) if mine else None,
        own=rows_of([seeded_row[pos[n]] for n in mine], len(seeded_row), pack) if mine else None,
    )


def has_penalties(p: SamplingParams) -> bool:
    return p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0


def has_top_k_or_p(p: SamplingParams, vocab: int) -> bool:
    return 0 < p.top_k < vocab or p.top_p < 1.0


def occurrence_keys(rows: list[SamplingRow], idx: list[int], vocab: int, pending: PendingTokens | None,
                     with_prompt: bool, pack: Pack | DirectPack) -> Keys | None:
    """The `Keys` of every output token (and prompt token, `with_prompt`) of rows `idx` inside the vocab: the
    host's from its token lists (a PLACEHOLDER is outside the vocab), the pending tokens' to be gathered where
    they are. None where there are none."""
    if not idx:
        return None
    lists = [r.output_token_ids for r in (rows[i] for i in idx)]
    owners = list(idx)
    if with_prompt:
        lists += [rows[i].prompt_token_ids for i in idx]
        owners += idx
    # one conversion for all rows (per-row numpy calls cost more than the tokens at a few hundred each)
    lengths = np.fromiter(map(len, lists), np.int64, len(lists))
    tokens = np.fromiter(itertools.chain.from_iterable(lists), np.int64, int(lengths.sum()))
    host = (tokens + np.repeat(np.asarray(owners, dtype=np.int64) * vocab, lengths))[(tokens >= 0) & (tokens < vocab)]
    waiting = [i for i in idx if i in pending.rows] if pending is not None else []
    if not waiting:
        return Keys(pack.put(host), None) if host.size else None
    late = pack.put([pending.rows[i] for i in waiting] + [i * vocab for i in waiting])
    return Keys(pack.put(host) if host.size else None, late)


def stop_keys(rows: list[SamplingRow], idx: list[int], vocab: int) -> list[int]:
    """Flat keys of each row's stop tokens and (unless ignore_eos) EOS tokens, rows `idx` (under their
    min_tokens): masked with -inf."""
    keys = []
    for i in idx:
        row = rows[i]
        banned = set(row.params.stop_token_ids or [])
        if not row.params.ignore_eos:
            banned.update(row.eos_token_ids)
        keys.extend(i * vocab + t for t in banned if 0 <= t < vocab)
    return keys


def bias_entries(rows: list[SamplingRow], idx: list[int], vocab: int) -> tuple[list[int], list[float]]:
    """Each row's logit_bias as flat keys row * V + token and their values, all rows added in one scatter."""
    keys, values = [], []
    for i in idx:
        for token, bias in rows[i].params.logit_bias.items():
            if 0 <= token < vocab:
                keys.append(i * vocab + token)
                values.append(bias)
    return keys, values

from __future__ import annotations

import math
import random
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import RepetitionPenaltyLogitsProcessor

from hetero_infer.contracts.sampling_params import SamplingParams
from hetero_infer.worker.runner.sampler import Sampler, SamplingRow, make_generator, process_logits

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _logits(seed: int, rows: int, vocab: int, scale: float = 3.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, vocab, generator=gen) * scale


def _row(params: SamplingParams, sample_index: int = 0, output: list[int] | None = None) -> SamplingRow:
    gen = make_generator(params.seed, sample_index) if params.seed is not None else None
    return SamplingRow(params, [], list(output or []), gen, [])


def _allowed(z: np.ndarray, params: SamplingParams, slack: float = 1e-4) -> set[int]:
    """Brute force, float64: tokens the filters may keep (a tie- and rounding-tolerant superset)."""
    z = z / params.temperature
    order = sorted(range(len(z)), key=lambda j: -z[j])
    if 0 < params.top_k < len(z):
        order = order[: params.top_k]
    probs = [math.exp(z[j] - z[order[0]]) for j in order]
    total = sum(probs)
    kept, before = [], 0.0
    for j, p in zip(order, probs, strict=True):
        if params.top_p < 1.0 and before >= (params.top_p + slack) * total:
            break
        if p < params.min_p * (1 - slack):
            break
        kept.append(j)
        before += p
    floor = z[kept[-1]]
    return {j for j in range(len(z)) if z[j] >= floor}


def _reference_seeded(z: np.ndarray, params: SamplingParams, sample_index: int = 0) -> int:
    """The documented recipe: filtered softmax / Exp(1) noise from the request's own generator."""
    keep = sorted(_allowed(z, params, slack=0.0))
    scaled = z[keep] / params.temperature
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    noise = torch.empty(len(z)).exponential_(generator=make_generator(params.seed, sample_index)).double().numpy()
    return keep[int(np.argmax(probs / noise[keep]))]


random_params = st.builds(
    SamplingParams,
    temperature=st.sampled_from([0.3, 0.7, 1.0, 1.5]),
    top_k=st.sampled_from([-1, 1, 2, 5, 40, 300]),
    top_p=st.sampled_from([1.0, 0.9, 0.5, 0.1]),
    min_p=st.sampled_from([0.0, 0.0, 0.05, 0.3]),
    seed=st.one_of(st.none(), st.integers(-(2**40), 2**40)),
)


@FAST
@given(
    seed=st.integers(0, 2**31),
    batch=st.integers(1, 12),
    vocab=st.sampled_from([7, 64, 1000]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
)
def test_greedy_is_argmax(seed: int, batch: int, vocab: int, dtype: torch.dtype) -> None:
    logits = _logits(seed, batch, vocab).to(dtype)
    rows = [_row(SamplingParams(temperature=0.0, top_k=3, top_p=0.5)) for _ in range(batch)]
    out = Sampler()(logits, rows)
    assert [t.token_id for t in out] == logits.float().argmax(-1).tolist()


@FAST
@given(seed=st.integers(0, 2**31), params=random_params, vocab=st.sampled_from([50, 700]))
def test_filters_never_sample_outside_allowed_set(seed: int, params: SamplingParams, vocab: int) -> None:
    params.seed = None
    logits = _logits(seed, 1, vocab, scale=random.Random(seed).choice([0.3, 2.0, 6.0])).repeat(64, 1)
    tokens = {t.token_id for t in Sampler()(logits, [_row(params) for _ in range(64)])}
    assert tokens <= _allowed(logits[0].double().numpy(), params)


def test_top_k_one_and_tiny_top_p_are_greedy() -> None:
    logits = _logits(1, 32, 500)
    rows = [_row(SamplingParams(top_k=1)) for _ in range(16)] + [_row(SamplingParams(top_p=1e-6)) for _ in range(16)]
    assert [t.token_id for t in Sampler()(logits, rows)] == logits.argmax(-1).tolist()


def test_wide_nucleus_beyond_first_candidate_pass() -> None:
    # Nearly flat rows: a 0.99 nucleus needs most of a 3000-token vocab, past the first top-k pass.
    logits = _logits(3, 1, 3000, scale=0.05).repeat(48, 1)
    params = SamplingParams(top_p=0.99, min_p=0.0)
    tokens = [t.token_id for t in Sampler()(logits, [_row(params) for _ in range(48)])]
    allowed = _allowed(logits[0].double().numpy(), params)
    assert set(tokens) <= allowed and len(allowed) > 2000
    # Drawn from the whole nucleus, not a truncated head of it.
    rank = {t: r for r, t in enumerate(logits[0].argsort(descending=True).tolist())}
    assert sorted(rank[t] for t in tokens)[len(tokens) // 2] > 500


@FAST
@given(
    seed=st.integers(0, 2**31),
    params=random_params,
    vocab=st.sampled_from([30, 400, 3000]),
    scale=st.sampled_from([0.05, 1.0, 4.0]),
)
def test_seeded_row_matches_reference_recipe(seed: int, params: SamplingParams, vocab: int, scale: float) -> None:
    params.seed = seed
    logits = _logits(seed, 1, vocab, scale)
    token = Sampler()(logits, [_row(params)])[0].token_id
    assert token == _reference_seeded(logits[0].double().numpy(), params)


@pytest.mark.parametrize("seed", range(6))
def test_seeded_wide_nucleus_matches_reference(seed: int) -> None:
    # The nucleus outgrows the first top-k pass: the retry must reuse the row's noise.
    params = SamplingParams(temperature=0.5, top_p=0.95, seed=seed)
    logits = _logits(seed, 1, 3000, scale=0.05)
    assert Sampler()(logits, [_row(params)])[0].token_id == _reference_seeded(logits[0].double().numpy(), params)


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    params=st.lists(random_params, min_size=1, max_size=8),
    fillers=st.lists(random_params, max_size=8),
    data=st.data(),
)
def test_seeded_rows_independent_of_batch(
    seed: int, params: list[SamplingParams], fillers: list[SamplingParams], data: st.DataObject
) -> None:
    vocab = 500
    base = _logits(seed, len(params), vocab)
    extra = _logits(seed + 1, len(fillers), vocab)

    def run(order: list[int], filler_ids: list[int], steps: int = 3) -> dict[int, list[int]]:
        rows = {i: _row(params[i], sample_index=1) for i in order}
        others = [_row(fillers[j]) for j in filler_ids]
        got: dict[int, list[int]] = {i: [] for i in order}
        for _ in range(steps):
            batch = [rows[i] for i in order] + others
            logits = torch.cat([base[order], extra[filler_ids]]) if filler_ids else base[order]
            out = Sampler()(logits, batch)
            for i, tok in zip(order, out, strict=False):
                got[i].append(tok.token_id)
        return got

    first = run(list(range(len(params))), [])
    order = data.draw(st.permutations(range(len(params))))
    filler_ids = data.draw(st.lists(st.integers(0, max(len(fillers) - 1, 0)), max_size=6)) if fillers else []
    second = run(list(order), filler_ids)
    for i, p in enumerate(params):
        if p.seed is not None:
            assert first[i] == second[i]


def test_samples_of_one_request_differ_but_reproduce() -> None:
    logits = torch.zeros(1, 1000)  # uniform: any repeat would be a generator collision
    params = SamplingParams(seed=1234)

    def draw(index: int) -> list[int]:
        row = _row(params, sample_index=index)
        return [Sampler()(logits, [row])[0].token_id for _ in range(8)]

    runs = [draw(i) for i in range(4)]
    assert runs == [draw(i) for i in range(4)]
    assert len({tuple(r) for r in runs}) == 4


def test_make_generator_index_zero_is_plain_seed() -> None:
    for seed in (0, 7, -3, 2**63 + 5):
        expected = torch.Generator().manual_seed(seed & (2**64 - 1))
        assert torch.equal(torch.rand(4, generator=make_generator(seed, 0)), torch.rand(4, generator=expected))
    assert not torch.equal(torch.rand(4, generator=make_generator(5, 1)), torch.rand(4, generator=make_generator(6, 0)))


def _reference_penalties(
    logits: torch.Tensor, prompt: list[int], output: list[int], rep: float, freq: float, pres: float
) -> torch.Tensor:
    ids = torch.tensor([prompt + output]) if prompt + output else torch.zeros(1, 0, dtype=torch.long)
    out = RepetitionPenaltyLogitsProcessor(rep)(ids, logits.clone().unsqueeze(0))[0]
    for token, count in Counter(output).items():
        out[token] -= freq * count + pres
    return out


@FAST
@given(
    seed=st.integers(0, 2**31),
    specs=st.lists(
        st.tuples(
            st.lists(st.integers(0, 49), max_size=20),
            st.lists(st.integers(0, 49), max_size=20),
            st.sampled_from([1.0, 0.7, 1.3, 2.0]),
            st.sampled_from([0.0, 0.5, -1.0, 2.0]),
            st.sampled_from([0.0, 0.4, -0.3, 2.0]),
        ),
        min_size=1,
        max_size=6,
    ),
    layout=st.sampled_from(["contiguous", "transposed", "sliced"]),
)
def test_penalties_match_reference(seed: int, specs, layout: str) -> None:
    logits = _logits(seed, len(specs), 50)
    if layout == "transposed":
        logits = logits.t().contiguous().t()
    elif layout == "sliced":
        logits = torch.cat([logits, logits[:, :7]], dim=1)[:, :50]
    rows = [
        SamplingRow(
            SamplingParams(repetition_penalty=rep, frequency_penalty=freq, presence_penalty=pres),
            prompt,
            output,
            None,
            [],
        )
        for prompt, output, rep, freq, pres in specs
    ]
    before = logits.clone()
    got = process_logits(logits, rows)
    assert torch.equal(logits, before)  # never in place
    for i, (prompt, output, rep, freq, pres) in enumerate(specs):
        torch.testing.assert_close(got[i], _reference_penalties(logits[i], prompt, output, rep, freq, pres))


def test_penalties_steer_greedy_choice() -> None:
    logits = torch.tensor([[5.0, 4.9, 0.0, -1.0]])
    params = SamplingParams(temperature=0.0, frequency_penalty=0.5)
    assert Sampler()(logits, [SamplingRow(params, [], [0], None)])[0].token_id == 1
    assert Sampler()(logits, [SamplingRow(SamplingParams(temperature=0.0), [], [0], None)])[0].token_id == 0


def test_min_tokens_masks_eos_and_stop_ids() -> None:
    logits = torch.full((4, 10), -5.0)
    logits[:, 3] = 10.0  # eos
    logits[:, 5] = 9.0  # stop token id
    logits[:, 7] = 0.0
    params = SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=[5])
    rows = [
        SamplingRow(params, [1], [], None, [3]),
        SamplingRow(params, [1], [2], None, [3]),
        SamplingRow(params, [1], [2, 2], None, [3]),  # min_tokens reached
        SamplingRow(SamplingParams(temperature=0.0, min_tokens=2, ignore_eos=True), [1], [], None, [3]),
    ]
    assert [t.token_id for t in Sampler()(logits, rows)] == [7, 7, 3, 3]
    random_rows = [SamplingRow(SamplingParams(min_tokens=5, stop_token_ids=[5]), [], [], None, [3])] * 64
    assert {t.token_id for t in Sampler()(logits.repeat(16, 1), random_rows)}.isdisjoint({3, 5})


@FAST
@given(
    seed=st.integers(0, 2**31),
    n=st.integers(0, 20),
    temperature=st.sampled_from([0.0, 0.5, 1.0]),
    rep=st.sampled_from([1.0, 1.5]),
)
def test_logprobs_are_raw_log_softmax(seed: int, n: int, temperature: float, rep: float) -> None:
    vocab = 20
    logits = _logits(seed, 3, vocab).to(torch.bfloat16)
    params = SamplingParams(temperature=temperature, logprobs=n, top_k=5, repetition_penalty=rep)
    rows = [SamplingRow(params, [1, 2], [3], None), SamplingRow(SamplingParams(), [], [], None)] * 1 + [
        SamplingRow(SamplingParams(logprobs=vocab), [], [], None)
    ]
    out = Sampler()(logits, rows)
    ref = torch.log_softmax(logits.float(), -1)
    for i, tok in enumerate(out):
        assert tok.logprob == pytest.approx(ref[i, tok.token_id].item(), abs=1e-5)
    first, plain, full = out
    assert plain.top_logprobs is None
    assert first.token_id in first.top_logprobs
    assert len(first.top_logprobs) in (n, n + 1)
    # The n largest values, not indices: bfloat16 logits tie, and which tied token makes the cut is arbitrary.
    expected_top = ref[0].topk(n).values.tolist() if n else []
    returned_top = sorted((ref[0, t].item() for t in first.top_logprobs), reverse=True)[:n]
    assert returned_top == pytest.approx(expected_top, abs=1e-5)
    for token, lp in first.top_logprobs.items():
        assert lp == pytest.approx(ref[0, token].item(), abs=1e-5)
    assert sum(math.exp(v) for v in full.top_logprobs.values()) == pytest.approx(1.0, abs=1e-4)


def test_logprobs_only_when_asked_if_configured() -> None:
    logits = _logits(0, 2, 30)
    rows = [_row(SamplingParams(temperature=0.0)), _row(SamplingParams(temperature=0.0, logprobs=0))]
    lazy = Sampler(all_logprobs=False)(logits, rows)
    assert lazy[0].logprob is None and lazy[0].top_logprobs is None
    assert lazy[1].top_logprobs == {lazy[1].token_id: lazy[1].logprob}
    assert all(t.logprob is not None for t in Sampler()(logits, rows))


def _chi_square(tokens: list[int], probs: torch.Tensor) -> float:
    counts = Counter(tokens)
    n = len(tokens)
    return sum((counts.get(j, 0) - n * p) ** 2 / (n * p) for j, p in enumerate(probs.tolist()) if p > 0)


@pytest.mark.parametrize("seeded", [False, True])
def test_temperature_sampling_matches_softmax(seeded: bool) -> None:
    torch.manual_seed(0)
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0]])
    temperature = 0.8
    draws = 4000 if seeded else 20000
    rows = [
        _row(SamplingParams(temperature=temperature, seed=i if seeded else None)) for i in range(draws)
    ]
    tokens = [t.token_id for t in Sampler()(logits.expand(draws, -1), rows)]
    probs = torch.softmax(logits[0] / temperature, -1)
    # 7 degrees of freedom: the 0.999 quantile is 24.3.
    assert _chi_square(tokens, probs) < 30.0


def test_filtered_sampling_renormalises() -> None:
    torch.manual_seed(1)
    logits = torch.tensor([[3.0, 2.5, 2.0, 1.0, 0.5, 0.0, -1.0, -2.0]])
    params = SamplingParams(temperature=1.2, top_k=5, top_p=0.9)
    tokens = [t.token_id for t in Sampler()(logits.expand(20000, -1), [_row(params)] * 20000)]
    keep = sorted(_allowed(logits[0].double().numpy(), params, slack=0.0))
    probs = torch.zeros(8)
    probs[keep] = torch.softmax(logits[0, keep] / 1.2, -1)
    assert set(tokens) == set(keep)
    assert _chi_square(tokens, probs) < 30.0


def test_input_logits_untouched_and_shape_checked() -> None:
    logits = _logits(5, 4, 100)
    before = logits.clone()
    rows = [
        SamplingRow(SamplingParams(repetition_penalty=1.5, min_tokens=3), [1, 2], [3], None, [0]),
        _row(SamplingParams(top_p=0.5)),
        _row(SamplingParams(min_p=0.2, seed=3)),
        _row(SamplingParams(temperature=0.0, presence_penalty=1.0)),
    ]
    Sampler()(logits, rows)
    assert torch.equal(logits, before)
    with pytest.raises(ValueError):
        Sampler()(logits, rows[:2])

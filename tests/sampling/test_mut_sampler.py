"""Sampler edge cases that mutation testing found unchecked (docs/testing.md, "Round 3").

References are computed here without the sampler: Vigna's splitmix64 in plain Python for the per-sample
seeds, transformers' logits warpers for which tokens top-p and min-p keep at their exact boundaries,
plain float64 arithmetic for the penalties.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from transformers import MinPLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from hetero_infer.contracts.sampling_params import SamplingParams
from hetero_infer.worker.runner import sampler as sampler_module
from hetero_infer.worker.runner.sampler import Sampler, SamplingRow, make_generator, process_logits

_M64 = 2**64


def _splitmix64(seed: int, count: int) -> list[int]:
    """The first `count` outputs of splitmix64 (Vigna, prng.di.unimi.it/splitmix64.c) started at `seed`."""
    state, out = seed % _M64, []
    for _ in range(count):
        state = (state + 0x9E3779B97F4A7C15) % _M64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % _M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % _M64
        out.append(z ^ (z >> 31))
    return out


@pytest.mark.parametrize("seed", [0, 1, -3, 12345, 2**63 + 5, 2**64 - 1])
def test_sample_generators_follow_splitmix64(seed: int) -> None:
    # Sample 0 takes the seed itself; sample i > 0 the (i + 1)-th splitmix64 output from the seed, so seeds
    # stay reproducible across versions (a changed constant would silently change every seeded n > 1 output).
    assert torch.equal(torch.rand(6, generator=make_generator(seed)),
                       torch.rand(6, generator=torch.Generator().manual_seed(seed % _M64)))  # the default: sample 0
    outputs = _splitmix64(seed, 101)
    for index in (1, 2, 3, 7, 100):
        expected = torch.Generator().manual_seed(outputs[index])
        assert torch.equal(torch.rand(6, generator=make_generator(seed, index)), torch.rand(6, generator=expected))


def _seeded_draws(logits: torch.Tensor, params: SamplingParams, seeds: range) -> Counter[int]:
    rows = [SamplingRow(params, [], [], make_generator(s), []) for s in seeds]
    return Counter(t.token_id for t in Sampler()(logits.expand(len(rows), -1), rows))


def _hf_kept(logits: torch.Tensor, top_k: int = -1, top_p: float = 1.0, min_p: float = 0.0) -> set[int]:
    """Tokens transformers' warpers keep (vLLM's order: top-k, top-p, min-p; temperature 1)."""
    scores = logits.clone().unsqueeze(0)
    if top_k > 0:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(None, scores)
    if min_p > 0.0:
        scores = MinPLogitsWarper(min_p)(None, scores)
    return set(torch.isfinite(scores[0]).nonzero().flatten().tolist())


def _two_tied_maxima() -> torch.Tensor:
    # Two tied maxima (exactly representable probabilities 1/2 each), everything else exp(-1e4) = 0.
    logits = torch.full((12,), -1e4)
    logits[4] = logits[9] = 0.0
    return logits


@pytest.mark.parametrize("top_k", [-1, 6], ids=["whole_vocab", "top_k"])
def test_min_p_one_keeps_every_tied_maximum(top_k: int) -> None:
    # min_p compares with >=: a token exactly min_p times as likely as the top one stays (transformers keeps
    # both tied maxima at min_p = 1). Both paths: the whole vocab (no top-k) and the top-k candidates.
    logits = _two_tied_maxima()
    params = SamplingParams(min_p=1.0, top_k=top_k)
    assert _hf_kept(logits, top_k=top_k, min_p=1.0) == {4, 9}
    draws = _seeded_draws(logits, params, range(200))
    assert set(draws) == {4, 9} and min(draws.values()) > 60


@pytest.mark.parametrize("top_k", [-1, 6], ids=["mass_of_the_row", "mass_of_the_top_k"])
def test_top_p_stops_once_the_mass_before_a_token_reaches_p(top_k: int) -> None:
    # Two tokens of probability 1/2, top_p = 0.5: the first reaches the nucleus, the second is outside
    # (transformers' TopPLogitsWarper and vLLM keep one). Which of the tied two is kept is arbitrary.
    logits = _two_tied_maxima()
    params = SamplingParams(top_p=0.5, top_k=top_k)
    assert len(_hf_kept(logits, top_k=top_k, top_p=0.5)) == 1
    draws = _seeded_draws(logits, params, range(100))
    assert len(draws) == 1 and set(draws) <= {4, 9}


@pytest.mark.timeout(60)
def test_a_nucleus_just_below_one_ends_at_the_full_vocab() -> None:
    # top_p = 1 - 2**-24 on a 300-token row whose float32 partial sums fall just short of top_p times the
    # row's mass (found by search): the first pass (256 candidates) retries wider, the full-vocab pass must
    # stop there instead of retrying forever.
    logits = torch.randn(1, 300, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(top_p=1 - 2**-24)
    tokens = [t.token_id for t in Sampler()(logits.expand(4, -1), [SamplingRow(params, [], [], None, [])] * 4)]
    assert all(0 <= t < 300 for t in tokens)


def _reference_penalties(z: list[float], prompt: list[int], output: list[int], rep: float, freq: float,
                         pres: float) -> list[float]:
    """HF repetition penalty over prompt + output, then OpenAI frequency/presence over output, float64;
    token ids outside the row are not the row's tokens."""
    z = list(z)
    for t in {t for t in prompt + output if 0 <= t < len(z)}:
        z[t] = z[t] / rep if z[t] > 0 else z[t] * rep
    for t, count in Counter(t for t in output if 0 <= t < len(z)).items():
        z[t] -= freq * count + pres
    return z


def test_penalties_skip_token_ids_outside_the_vocab_and_count_token_zero() -> None:
    # A prompt may hold ids the logits row does not have (a tokenizer larger than the model's head): they
    # must neither fail nor penalize a neighbour row (flat key row * V + V is the next row's token 0,
    # row * V - 1 the previous row's last token).
    vocab = 10
    logits = torch.linspace(-2.0, 2.5, 2 * vocab).reshape(2, vocab)
    params = SamplingParams(repetition_penalty=1.7, frequency_penalty=0.3, presence_penalty=0.2)
    specs = [([0, vocab, -1, 3], [vocab, 5, 0, 5, -1]), ([2, vocab + 4], [7, vocab, -1])]
    rows = [SamplingRow(params, prompt, output, None, []) for prompt, output in specs]
    got = process_logits(logits, rows)
    for i, (prompt, output) in enumerate(specs):
        expected = _reference_penalties(logits[i].tolist(), prompt, output, 1.7, 0.3, 0.2)
        torch.testing.assert_close(got[i].double(), torch.tensor(expected, dtype=torch.float64), atol=1e-5, rtol=0)


def test_penalties_on_non_contiguous_half_precision_logits() -> None:
    # bfloat16 logits, transposed in memory: the float32 copy is not contiguous and must be made so before
    # the flat (row * V + token) updates.
    vocab = 16
    logits = (torch.linspace(-3.0, 3.0, 3 * vocab).reshape(3, vocab)).to(torch.bfloat16).t().contiguous().t()
    assert not logits.is_contiguous()
    specs = [([1, 2], [2, 9, 9], 1.5, 0.5, 0.25), ([], [0, 15], 0.8, -0.5, 1.0), ([4], [], 2.0, 0.0, 0.0)]
    rows = [SamplingRow(SamplingParams(repetition_penalty=r, frequency_penalty=f, presence_penalty=p), pr, out,
                        None, []) for pr, out, r, f, p in specs]
    got = process_logits(logits, rows)
    for i, (prompt, output, r, f, p) in enumerate(specs):
        expected = _reference_penalties(logits[i].double().tolist(), prompt, output, r, f, p)
        torch.testing.assert_close(got[i].double(), torch.tensor(expected, dtype=torch.float64), atol=1e-5, rtol=0)


def test_min_tokens_masks_stop_id_zero_and_ignores_ids_outside_the_vocab() -> None:
    vocab = 8
    logits = torch.tensor([[9.0, 1.0, 2.0, 3.0, 8.0, 0.0, 0.0, 5.0]])
    params = SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=[0, vocab, vocab + 2])
    rows = [SamplingRow(params, [1], [], None, [4, -1])]
    assert Sampler()(logits, rows)[0].token_id == 7  # 0 (stop id) and 4 (eos) masked; -1 is no token (not 7)


@pytest.mark.parametrize("shape", [(2, 1, 30), (30,)], ids=["3d", "1d"])
def test_logits_that_are_not_rows_by_vocab_are_refused(shape: tuple[int, ...]) -> None:
    rows = [SamplingRow(SamplingParams(), [], [], None, []) for _ in range(shape[0] if len(shape) > 1 else 30)]
    with pytest.raises(ValueError, match="logits must be"):
        Sampler()(torch.zeros(shape), rows)


def test_top_k_equal_to_the_vocab_is_no_top_k() -> None:
    # top_k = V keeps every token: with top-p the row must be sampled exactly as with top_k = -1 (same seed,
    # same token), its nucleus still allowed to outgrow the first candidate pass.
    logits = torch.randn(1, 3000, generator=torch.Generator().manual_seed(3)) * 0.05
    for seed in range(4):
        tokens = [
            Sampler()(logits, [SamplingRow(SamplingParams(top_p=0.99, top_k=k), [], [], make_generator(seed), [])])
            for k in (3000, -1)
        ]
        assert tokens[0][0].token_id == tokens[1][0].token_id


def test_a_narrow_nucleus_takes_one_candidate_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    # The point of the candidate passes: a top-p nucleus inside the 256 largest logits never sorts the
    # whole vocab (a row is retried wider only when its nucleus may extend past the pass).
    widths: list[int] = []
    inner = sampler_module._sample_candidates

    def counting(x, rows, idx, pos, width, *rest):
        widths.append(width)
        return inner(x, rows, idx, pos, width, *rest)

    monkeypatch.setattr(sampler_module, "_sample_candidates", counting)
    logits = torch.randn(8, 5000, generator=torch.Generator().manual_seed(4)) * 5.0  # nuclei of 7 to 55 tokens
    rows = [SamplingRow(SamplingParams(top_p=p), [], [], None, []) for p in (0.5, 0.9) * 4]
    tokens = [t.token_id for t in Sampler()(logits, rows)]
    assert len(widths) == 1 and widths[0] < 5000
    for i, t in enumerate(tokens):
        assert t in _hf_kept(logits[i], top_p=rows[i].params.top_p)


def test_a_batch_with_more_rows_than_vocab_entries() -> None:
    # Rows 0-3 greedy, 4-6 top-1: the greedy rows are a prefix of the batch exactly as long as the vocab; the last
    # rows' penalties are indexed by row, not by token.
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]]).repeat(7, 1)
    params = [SamplingParams(temperature=0.0)] * 4 + [SamplingParams(top_k=1)]
    rows = [SamplingRow(p, [], [], None, []) for p in params]
    rows.append(SamplingRow(SamplingParams(top_k=1, repetition_penalty=4.0), [1], [], None, []))
    rows.append(SamplingRow(SamplingParams(top_k=1, frequency_penalty=0.5, presence_penalty=0.6), [], [1], None, []))
    out = Sampler()(logits, rows)
    assert [t.token_id for t in out] == [1] * 5 + [3, 3]  # 3.0 / 4 < 2.0 and 3.0 - 0.5 - 0.6 < 2.0


@pytest.mark.parametrize("min_p", [0.0, 0.9])
def test_temperature_only_rows_race_over_the_whole_vocab(min_p: float) -> None:
    # No top-k or top-p: every token of a flat 3000-token row can win, so the seeded token is the recipe's
    # race over the whole vocab (softmax(z / T) / Exp(1) noise from the request's generator), not over the
    # first 256 candidates; min-p (0.9: a few dozen tokens) is applied to it. Logits around 40, as a real
    # model's can be: the probabilities are relative to the row's maximum, never exp(z / T) itself (exp(80)
    # overflows float32).
    vocab, temperature = 3000, 0.7
    z = (torch.randn(vocab, generator=torch.Generator().manual_seed(5)) * 0.05).double() + 40.0
    unfiltered = torch.softmax(z / temperature, -1)
    probs = torch.where(unfiltered >= min_p * unfiltered.max(), unfiltered, 0.0)
    params = SamplingParams(temperature=temperature, min_p=min_p)
    ranks = z.argsort(descending=True).argsort()
    beyond_first_pass = filtered_out = 0
    for seed in range(24):
        noise = torch.empty(vocab).exponential_(generator=make_generator(seed)).double()
        expected = int((probs / noise).argmax())
        got = Sampler()(z.float()[None], [SamplingRow(params, [], [], make_generator(seed), [])])[0].token_id
        assert got == expected
        beyond_first_pass += int(ranks[expected] >= 256)
        filtered_out += int(expected != int((unfiltered / noise).argmax()))
    assert (beyond_first_pass > 0) if min_p == 0.0 else (filtered_out > 0)


def test_greedy_argmax_off_the_numpy_path() -> None:
    # Tensors numpy does not take as float32 on the CPU (another dtype here; a GPU's logits) go to torch's max:
    # still each row's first maximum.
    logits = torch.randn(5, 300, generator=torch.Generator().manual_seed(6))
    logits[2, [7, 200]] = 9.0
    expected = [int(torch.argmax(r)) for r in logits.double()]
    assert expected[2] == 7
    assert sampler_module._argmax(logits.double()).tolist() == expected
    assert sampler_module._argmax(logits.to(torch.bfloat16)).tolist() == [
        int(torch.argmax(r)) for r in logits.to(torch.bfloat16).double()]


@pytest.mark.parametrize("penalty", [dict(frequency_penalty=1.0), dict(presence_penalty=-1.0),
                                     dict(repetition_penalty=2.0)], ids=lambda d: next(iter(d)))
def test_a_single_penalty_of_any_value_applies(penalty: dict[str, float]) -> None:
    logits = torch.tensor([[1.0, 2.0, 3.0, -1.0]])
    row = SamplingRow(SamplingParams(**penalty), [0], [2, 2], None, [])
    args = {"rep": 1.0, "freq": 0.0, "pres": 0.0}
    args.update({{"repetition_penalty": "rep", "frequency_penalty": "freq", "presence_penalty": "pres"}[k]: v
                 for k, v in penalty.items()})
    expected = _reference_penalties(logits[0].tolist(), [0], [2, 2], **args)
    torch.testing.assert_close(process_logits(logits, [row])[0].double(), torch.tensor(expected, dtype=torch.float64))

"""The all-greedy fast path (`Sampler.argmax`, taken by the engine where every row `takes_argmax`): each row's
first maximum (a row holding a NaN: its first NaN, as torch's max), found by a plain Python scan, and the full
sampler's choice, with ties, infinities and NaNs; and which rows may take it."""

from __future__ import annotations

import pytest
import torch

from hetero_infer.contracts.sampling_params import SamplingParams
from hetero_infer.worker.runner.sampler import Sampler, SamplingRow, takes_argmax

NAN, INF = float("nan"), float("inf")


def _first_max(row: list[float]) -> int:
    for i, v in enumerate(row):
        if v != v:
            return i
    return row.index(max(row))  # the first of equal maxima (-0.0 == 0.0)


def _awkward_logits(vocab: int, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(8, vocab, generator=gen) * 3).to(dtype)
    x[1, [7, 300, vocab - 1]] = 50.0  # a three-way tie at the maximum
    x[2, 5], x[2, vocab - 3] = NAN, NAN  # NaNs: the first one wins
    x[3] = -INF  # nothing finite: index 0
    x[4, vocab - 1] = INF  # +inf at the very end
    x[5, 0], x[5, 1] = 0.0, -0.0  # the maximum a signed zero after...
    x[5, 2:] = -1.0
    x[6, 17] = NAN  # a NaN among a tie of +inf
    x[6, [3, 40]] = INF
    x[7] = x[7].clamp(max=1.0)  # many ties at 1.0 (float32), more in bfloat16
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", [49152, 1003])  # the default model's vocabulary, and one with a vector tail
def test_argmax_is_the_first_maximum_and_the_full_samplers_choice(dtype: torch.dtype, vocab: int) -> None:
    logits = _awkward_logits(vocab, dtype)
    expected = [_first_max(row) for row in logits.double().tolist()]
    assert expected[1] == 7 and expected[2] == 5 and expected[3] == 0 and expected[6] == 17
    assert Sampler(all_logprobs=False).argmax(logits) == expected
    rows = [SamplingRow(SamplingParams(temperature=0.0), [1, 2], [3], None, [0]) for _ in range(logits.shape[0])]
    assert [t.token_id for t in Sampler(all_logprobs=False)(logits, rows)] == expected


def test_argmax_refuses_a_sampler_that_fills_logprobs() -> None:
    with pytest.raises(AssertionError):
        Sampler(all_logprobs=True).argmax(torch.zeros(1, 8))


class _Grammar:  # any grammar state: its rows are masked first
    pass


@pytest.mark.parametrize(("params", "num_output", "grammar", "expected"), [
    (SamplingParams(temperature=0.0), 0, None, True),
    (SamplingParams(temperature=0.0, min_tokens=3), 3, None, True),  # min_tokens reached: nothing masked
    (SamplingParams(temperature=0.0, max_tokens=5, stop=["x"], seed=1), 0, None, True),
    (SamplingParams(temperature=0.7), 0, None, False),
    (SamplingParams(temperature=0.0, logprobs=0), 0, None, False),
    (SamplingParams(temperature=0.0, min_tokens=3), 2, None, False),
    (SamplingParams(temperature=0.0, logit_bias={5: 1.0}), 0, None, False),
    (SamplingParams(temperature=0.0, repetition_penalty=1.1), 0, None, False),
    (SamplingParams(temperature=0.0, presence_penalty=0.5), 0, None, False),
    (SamplingParams(temperature=0.0, frequency_penalty=0.5), 0, None, False),
    (SamplingParams(temperature=0.0), 0, _Grammar(), False),
])
def test_which_rows_take_the_argmax(params: SamplingParams, num_output: int, grammar, expected: bool) -> None:
    assert takes_argmax(params, num_output, grammar) is expected

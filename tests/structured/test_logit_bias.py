"""logit_bias in the batched sampler against a NumPy reference (logits + dense bias vector): +100 forces a token,
-100 bans one, other values shift the row by exactly the bias, and rows of one batch do not mix."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hetero_infer.contracts.sampling_params import SamplingParams
from hetero_infer.worker.runner.sampler import Sampler, SamplingRow, make_generator, process_logits

VOCAB = 300


def row(bias=None, **kwargs) -> SamplingRow:
    seed = kwargs.pop("seed", None)
    params = SamplingParams(logit_bias=bias, seed=seed, **kwargs)
    return SamplingRow(params, [1, 2], [], make_generator(seed) if seed is not None else None)


def reference(logits: torch.Tensor, biases: list[dict | None]) -> np.ndarray:
    out = logits.numpy().astype(np.float64).copy()
    for i, bias in enumerate(biases):
        for token, value in (bias or {}).items():
            out[i, token] += value
    return out


def test_bias_adds_exactly_the_value_per_row():
    torch.manual_seed(0)
    logits = torch.randn(4, VOCAB)
    biases = [{3: 2.5, 7: -1.25}, None, {3: -0.5, 299: 7.0}, {0: 100.0, 1: -100.0}]
    before = logits.clone()
    x = process_logits(logits, [row(b) for b in biases])
    np.testing.assert_allclose(x.numpy(), reference(logits, biases), rtol=0, atol=1e-4)
    assert torch.equal(logits, before)  # the input is not modified


def test_plus_100_forces_and_minus_100_bans_in_every_sampling_mode():
    torch.manual_seed(1)
    logits = torch.randn(6, VOCAB) * 3
    top = logits.argmax(dim=-1).tolist()
    rows = [
        row({42: 100.0}, temperature=0.0),
        row({top[1]: -100.0}, temperature=0.0),
        row({17: 100.0}, temperature=1.0, seed=5),
        row({99: 100.0}, temperature=0.8, top_k=20, top_p=0.9),
        row(None, temperature=0.0),
        row({top[5]: -100.0}, temperature=0.0, top_k=3),
    ]
    second = reference(logits, [None] * 6)[1].argsort()[-2]
    for _ in range(20):
        tokens = [t.token_id for t in Sampler()(logits, rows)]
        assert tokens[0] == 42 and tokens[2] == 17 and tokens[3] == 99
        assert tokens[1] == second and tokens[4] == top[4]
        assert tokens[5] == reference(logits, [None] * 6)[5].argsort()[-2]


@pytest.mark.parametrize("temperature", [0.7, 1.3])
def test_minus_100_ban_holds_under_random_sampling(temperature):
    logits = torch.zeros(1, VOCAB)
    logits[0, :3] = 5.0  # three favourites; ban two of them
    rows = [row({0: -100.0, 1: -100.0}, temperature=temperature)]
    drawn = {Sampler()(logits, rows)[0].token_id for _ in range(200)}
    assert 0 not in drawn and 1 not in drawn and 2 in drawn


def test_logprobs_stay_those_of_the_raw_logits():
    logits = torch.randn(1, VOCAB)
    [sampled] = Sampler()(logits, [row({5: 100.0}, temperature=0.0, logprobs=1)])
    assert sampled.token_id == 5
    expected = torch.log_softmax(logits[0].double(), dim=-1)[5].item()
    assert sampled.logprob == pytest.approx(expected, abs=1e-4)

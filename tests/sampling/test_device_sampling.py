"""`Sampler.sample_on_device` (the tokens of temperature/top-k/top-p/min-p rows kept where the logits are)
against the host sampler `Sampler.__call__`: seeded rows bit for bit, generators advanced alike; unseeded rows
from the filtered distribution. On the CPU, where the "device" is the host, so identity is checkable."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from hetero_infer.worker.core.sampling_params import SamplingParams
from hetero_infer.worker.runner import sampler as sampler_module
from hetero_infer.worker.runner.sampler import (
    Sampler,
    SamplingRow,
    make_generator,
    sample_logits,
    samples_on_device,
    takes_argmax,
)


def _rows(params: list[SamplingParams]) -> list[SamplingRow]:
    return [SamplingRow(p, [1, 2], [3], make_generator(p.seed, i % 3) if p.seed is not None else None, [0])
            for i, p in enumerate(params)]


_params = st.builds(
    lambda greedy, t, k, p, min_p, seed: SamplingParams(temperature=0.0 if greedy else t, top_k=k, top_p=p,
                                                        min_p=min_p, seed=seed),
    st.sampled_from([False, False, False, True]),
    st.floats(0.05, 3.0),
    st.sampled_from([0, -1, 1, 2, 7, 40, 300, 5000]),
    st.sampled_from([1.0, 1.0, 0.05, 0.5, 0.9, 0.99, 0.999]),
    st.sampled_from([0.0, 0.0, 0.01, 0.2]),
    st.none() | st.integers(0, 2**64 - 1),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(params=st.lists(_params, min_size=1, max_size=6), vocab=st.sampled_from([5, 300, 3000]),
       scale=st.sampled_from([0.3, 3.0]), seed=st.integers(0, 1000))
def test_device_tokens_equal_the_host_samplers_for_seeded_and_greedy_rows(params, vocab, scale, seed):
    """Wide nuclei (vocab 3000, flat logits, top-p 0.999) make the host retry wider passes that the device path
    does in one: the tokens must not change, nor must the generators' states after the step."""
    logits = torch.randn(len(params), vocab, generator=torch.Generator().manual_seed(seed)) * scale
    host_rows, device_rows = _rows(params), _rows(params)
    host = Sampler(all_logprobs=False)(logits, host_rows)
    tokens = Sampler(all_logprobs=False).sample_on_device(logits, device_rows, one_pass=True)
    assert tokens.dtype == torch.long and tokens.shape == (len(params),)
    for i, p in enumerate(params):
        if p.greedy or p.seed is not None:
            assert tokens[i].item() == host[i].token_id, (i, p)
        if p.seed is not None:
            assert torch.equal(host_rows[i].generator.get_state(), device_rows[i].generator.get_state())
        assert 0 <= tokens[i].item() < vocab


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.8),
    SamplingParams(temperature=1.3, top_p=0.8),
    SamplingParams(temperature=0.7, top_k=4),
    SamplingParams(temperature=1.0, top_k=5, top_p=0.9, min_p=0.1),
    SamplingParams(temperature=2.0, min_p=0.3),
], ids=["temperature", "top-p", "top-k", "k-p-min-p", "min-p"])
def test_unseeded_device_tokens_follow_the_filtered_distribution(params):
    """4,000 unseeded draws over a 7-token vocabulary: tokens outside the filters never, the rest in proportion
    (chi-square against the float64 distribution that temperature, top-k, top-p and min-p leave)."""
    z = np.array([2.0, 1.6, 1.1, 0.9, 0.2, -0.5, -1.5])
    n = 4000
    torch.manual_seed(7)
    tokens = Sampler(all_logprobs=False).sample_on_device(torch.tensor(z, dtype=torch.float32).repeat(n, 1),
                                                         _rows([params] * n))
    counts = np.bincount(tokens.numpy(), minlength=len(z))
    expected = _filtered_probs(z, params) * n
    assert counts[expected == 0].sum() == 0
    kept = expected > 0
    assert chisquare(counts[kept], expected[kept]).pvalue > 1e-4


def _filtered_probs(z: np.ndarray, p: SamplingParams) -> np.ndarray:
    rel = np.exp((z - z.max()) / p.temperature)  # z is sorted, descending
    keep = np.ones(len(z), dtype=bool)
    if 0 < p.top_k < len(z):
        keep[p.top_k:] = False
    if p.top_p < 1.0:
        masked = np.where(keep, rel, 0.0)
        exclusive = np.concatenate([[0.0], np.cumsum(masked)[:-1]])
        keep &= exclusive < p.top_p * masked.sum()
    keep &= rel >= p.min_p
    probs = np.where(keep, rel, 0.0)
    return probs / probs.sum()


def test_a_wide_nucleus_takes_one_pass_on_device_and_the_same_tokens(monkeypatch):
    """Flat logits over 3,000 tokens and top-p 0.999: the host's first 256-wide pass overflows and retries wider;
    the one-pass path (the default off the CPU) sorts the whole vocab once (no overflow read back) and picks the
    same seeded tokens."""
    passes = []
    candidates = sampler_module._sample_candidates
    monkeypatch.setattr(sampler_module, "_sample_candidates",
                        lambda x, rows, idx, pos, width, *a: passes.append(width) or candidates(x, rows, idx, pos,
                                                                                                width, *a))
    logits = torch.randn(4, 3000, generator=torch.Generator().manual_seed(5)) * 0.3
    params = [SamplingParams(temperature=1.0, top_p=0.999, seed=s) for s in range(4)]
    host = [t.token_id for t in Sampler(all_logprobs=False)(logits, _rows(params))]
    host_passes, passes[:] = list(passes), []
    tokens = Sampler(all_logprobs=False).sample_on_device(logits, _rows(params), one_pass=True).tolist()
    assert host_passes[0] == sampler_module._CANDIDATES and len(host_passes) >= 2
    assert passes == [3000] and tokens == host
    passes.clear()  # the default on the CPU (the read-back costs nothing there): the host's passes
    assert Sampler(all_logprobs=False).sample_on_device(logits, _rows(params)).tolist() == host
    assert passes == host_passes


def test_which_rows_sample_on_device():
    assert samples_on_device(SamplingParams(temperature=0.9, top_p=0.5, top_k=3, min_p=0.1, seed=1), 0, None)
    assert samples_on_device(SamplingParams(temperature=0.0), 0, None)
    for params in (SamplingParams(temperature=0.9, logprobs=0), SamplingParams(temperature=0.9, logit_bias={1: 2.0}),
                   SamplingParams(temperature=0.9, presence_penalty=0.5),
                   SamplingParams(temperature=0.9, repetition_penalty=1.1)):
        assert not samples_on_device(params, 5, None)
    assert not samples_on_device(SamplingParams(temperature=0.9, min_tokens=3), 2, None)
    assert samples_on_device(SamplingParams(temperature=0.9, min_tokens=3), 3, None)
    assert not samples_on_device(SamplingParams(temperature=0.9), 0, object())
    assert not takes_argmax(SamplingParams(temperature=0.9), 0, None)


def test_sample_logits_keeps_on_device_rows_off_the_host_sampler(monkeypatch):
    """`sample_logits` with every row on-device sampleable calls no `Sampler.__call__` and returns no
    SampledTokens; one row with logprobs (or a logits processor) sends the whole step to the host sampler."""
    calls = []
    host = Sampler.__call__
    monkeypatch.setattr(Sampler, "__call__", lambda self, logits, rows: calls.append(len(rows)) or host(self, logits,
                                                                                                         rows))
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    params = [SamplingParams(temperature=0.7, top_p=0.9, seed=3), SamplingParams(temperature=0.0),
              SamplingParams(temperature=1.1, top_k=5)]
    sampler = Sampler(all_logprobs=False)
    tokens, sampled = sample_logits(sampler, logits, _rows(params))
    assert sampled is None and calls == [] and tokens.shape == (3,)
    for extra in (SamplingParams(temperature=0.7, logprobs=2),
                  SamplingParams(temperature=0.7, logits_processors=[lambda ids, row: row])):
        tokens, sampled = sample_logits(sampler, logits, _rows(params[:2] + [extra]))
        assert sampled is not None and calls[-1] == 3
    assert sample_logits(Sampler(), logits, _rows(params))[1] is not None  # all_logprobs: the host fills them

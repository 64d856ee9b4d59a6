"""`Sampler.sample_on_device` (tokens and logprobs kept where the logits are, penalties, min_tokens and
logit_bias applied there) against the host sampler `Sampler.__call__`: seeded rows bit for bit, generators
advanced alike, logprobs equal; the processed logits equal where the penalties count a pending token (the step in
flight's, still on the device) that the host path knows; unseeded rows from the filtered distribution. On the CPU,
where the "device" is the host, so identity is checkable."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from hetero_infer.contracts.sampling_params import SamplingParams
from hetero_infer.worker.core.sequence import PLACEHOLDER
from hetero_infer.worker.runner import sampler as sampler_module
from hetero_infer.worker.runner import sampling_inputs
from hetero_infer.worker.runner.sampler import (
    PendingTokens,
    Sampler,
    SamplingRow,
    StepSample,
    make_generator,
    pending_tokens,
    process_logits,
    sample_logits,
    samples_on_device,
    takes_argmax,
)
from hetero_infer.worker.runner.staging import StagingArea


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
    tokens = Sampler(all_logprobs=False).sample_on_device(logits, device_rows, one_pass=True).tokens
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
                                                         _rows([params] * n)).tokens
    counts = np.bincount(tokens.numpy(), minlength=len(z))
    expected = _filtered_probs(z, params) * n
    assert counts[expected == 0].sum() == 0
    kept = expected > 0
    assert chisquare(counts[kept], expected[kept]).pvalue > 1e-4


def test_unseeded_penalised_device_tokens_follow_the_processed_distribution():
    """4,000 unseeded draws with penalties (the output's token 3 and the prompt's 1, 2), a logit_bias and a
    min_tokens mask (EOS 0): tokens in proportion to the float64 softmax of the logits those leave."""
    z = np.array([2.0, 1.6, 1.1, 0.9, 0.2, -0.5, -1.5])
    params = SamplingParams(temperature=0.9, repetition_penalty=1.5, frequency_penalty=0.5, presence_penalty=0.3,
                            logit_bias={6: 2.5}, min_tokens=4)
    n = 4000
    torch.manual_seed(8)
    tokens = Sampler(all_logprobs=False).sample_on_device(torch.tensor(z, dtype=torch.float32).repeat(n, 1),
                                                         _rows([params] * n)).tokens
    counts = np.bincount(tokens.numpy(), minlength=len(z))
    x = z.copy()
    for t in (1, 2, 3):  # prompt [1, 2], output [3]
        x[t] = x[t] / 1.5 if x[t] > 0 else x[t] * 1.5
    x[3] -= 0.5 + 0.3
    x[6] += 2.5
    x[0] = -np.inf
    expected = np.exp((x - x.max()) / 0.9)
    expected = expected / expected.sum() * n
    assert counts[0] == 0
    assert chisquare(counts[1:], expected[1:]).pvalue > 1e-4


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
    tokens = Sampler(all_logprobs=False).sample_on_device(logits, _rows(params), one_pass=True).tokens.tolist()
    assert host_passes[0] == sampling_inputs.CANDIDATES and len(host_passes) >= 2
    assert passes == [3000] and tokens == host
    passes.clear()  # the default on the CPU (the read-back costs nothing there): the host's passes
    assert Sampler(all_logprobs=False).sample_on_device(logits, _rows(params)).tokens.tolist() == host
    assert passes == host_passes


def test_which_rows_sample_on_device():
    """Every row but a grammar's or one with logits processors; `takes_argmax` stays greedy with nothing to
    process or report."""
    for params in (SamplingParams(temperature=0.9, top_p=0.5, top_k=3, min_p=0.1, seed=1),
                   SamplingParams(temperature=0.0), SamplingParams(temperature=0.9, logprobs=0),
                   SamplingParams(temperature=0.9, logit_bias={1: 2.0}), SamplingParams(presence_penalty=0.5),
                   SamplingParams(temperature=0.9, repetition_penalty=1.1), SamplingParams(min_tokens=3)):
        assert samples_on_device(SamplingRow(params, [1], [], None))
    assert not samples_on_device(SamplingRow(SamplingParams(), [1], [], None, token_bitmask=torch.zeros(1, dtype=torch.int32)))
    assert not samples_on_device(SamplingRow(SamplingParams(logits_processors=[lambda ids, row: row]), [1], [],
                                             None))
    assert takes_argmax(SamplingParams(temperature=0.0), 0, None)
    for params in (SamplingParams(temperature=0.9), SamplingParams(temperature=0.0, logprobs=0),
                   SamplingParams(temperature=0.0, logit_bias={1: 2.0}),
                   SamplingParams(temperature=0.0, frequency_penalty=0.5)):
        assert not takes_argmax(params, 5, None)
    assert not takes_argmax(SamplingParams(temperature=0.0, min_tokens=3), 2, None)
    assert takes_argmax(SamplingParams(temperature=0.0, min_tokens=3), 3, None)
    assert not takes_argmax(SamplingParams(temperature=0.0), 0, object())


def test_sample_logits_keeps_on_device_rows_off_the_host_sampler(monkeypatch):
    """`sample_logits` with every row on-device sampleable (logprobs, penalties, logit_bias, min_tokens included)
    calls no `Sampler.__call__` and returns its logprobs as tensors; one row with a logits processor sends the
    whole step to the host sampler, which returns every row's SampledToken."""
    calls = []
    host = Sampler.__call__
    monkeypatch.setattr(Sampler, "__call__", lambda self, logits, rows, pending=None: calls.append(len(rows)) or host(
        self, logits, rows, pending))
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    params = [SamplingParams(temperature=0.7, top_p=0.9, seed=3, logprobs=2), SamplingParams(temperature=0.0),
              SamplingParams(temperature=1.1, top_k=5, presence_penalty=0.4, logit_bias={4: 3.0}),
              SamplingParams(temperature=0.0, repetition_penalty=1.3, min_tokens=4, logprobs=0)]
    sampler = Sampler(all_logprobs=False)
    sample = sample_logits(sampler, logits, _rows(params))
    assert calls == [] and sample.sampled is None and sample.tokens.shape == (4,)
    assert sample.logprobs.rows == [0, 3] and sample.logprobs.top_n == [2, 0]
    extra = SamplingParams(temperature=0.7, logits_processors=[lambda ids, row: row])
    host_sample = sample_logits(sampler, logits, _rows(params[:3] + [extra]))
    assert host_sample.sampled is not None and calls[-1] == 4
    everything = sample_logits(Sampler(), logits, _rows(params))  # all_logprobs: every row's, on the device too
    assert everything.sampled is None and everything.logprobs.rows == [0, 1, 2, 3]
    assert all(t.logprob is not None for t in everything.on_host()[1])


_penalised = st.builds(
    lambda base, rep, freq, pres, min_tokens, bias, logprobs: SamplingParams(
        temperature=base.temperature, top_k=base.top_k, top_p=base.top_p, min_p=base.min_p, seed=base.seed,
        repetition_penalty=rep, frequency_penalty=freq, presence_penalty=pres, min_tokens=min_tokens,
        logit_bias=bias, logprobs=logprobs, stop_token_ids=[2]),
    _params,
    st.sampled_from([1.0, 1.0, 0.7, 1.3]),
    st.sampled_from([0.0, 0.5, -1.0]),
    st.sampled_from([0.0, 0.4, -0.3]),
    st.sampled_from([0, 0, 3, 30]),
    st.none() | st.dictionaries(st.integers(0, 4), st.sampled_from([-100.0, -2.5, 1.5, 100.0]), max_size=3),
    st.none() | st.sampled_from([0, 1, 5]),
)
_history = st.lists(st.integers(0, 6), max_size=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=st.lists(st.tuples(_penalised, _history, _history, st.booleans()), min_size=1, max_size=6),
       vocab=st.sampled_from([7, 300]), scale=st.sampled_from([0.3, 3.0]), seed=st.integers(0, 1000))
def test_penalised_rows_on_device_equal_the_host_samplers(specs, vocab, scale, seed):
    """Penalties, min_tokens (EOS 0, stop id 2), logit_bias and logprobs on the device: rows whose newest output
    token is still pending (a PLACEHOLDER, counted from the device tokens) against the host path that knows it.
    The processed logits are equal bit for bit; seeded and greedy rows' tokens too, with their logprobs and
    generator states; every row gets exactly the logprobs it asked for."""
    logits = torch.randn(len(specs), vocab, generator=torch.Generator().manual_seed(seed)) * scale

    def rows(with_pending: bool) -> list[SamplingRow]:
        out = []
        for i, (p, prompt, output, late) in enumerate(specs):
            output = output + ([PLACEHOLDER] if late and with_pending else [5] if late else [])
            gen = make_generator(p.seed, i % 3) if p.seed is not None else None
            out.append(SamplingRow(p, prompt, output, gen, [0]))
        return out

    late_rows = [i for i, spec in enumerate(specs) if spec[3]]
    # the step in flight's tokens, where they are: row j of them holds late row late_rows[j]'s token 5
    pending = PendingTokens(torch.tensor([9] * len(specs) + [5] * len(late_rows)),
                            {i: len(specs) + j for j, i in enumerate(late_rows)}) if late_rows else None
    host_rows, device_rows = rows(False), rows(True)
    assert torch.equal(process_logits(logits, device_rows, pending), process_logits(logits, host_rows))
    host = Sampler(all_logprobs=False)(logits, host_rows)
    sample = Sampler(all_logprobs=False).sample_on_device(logits, device_rows, one_pass=True, pending=pending)
    token_ids, sampled = sample.on_host()
    for i, (p, *_) in enumerate(specs):
        if p.greedy or p.seed is not None:
            assert sampled is None or sampled[i] == host[i], (i, p)
            assert token_ids[i] == host[i].token_id, (i, p)
        if p.seed is not None:
            assert torch.equal(host_rows[i].generator.get_state(), device_rows[i].generator.get_state())
        if p.logprobs is None:
            assert sampled is None or sampled[i].logprob is None
        else:
            assert sampled[i].top_logprobs[token_ids[i]] == sampled[i].logprob
            assert len(sampled[i].top_logprobs) in (min(p.logprobs, vocab), min(p.logprobs, vocab) + 1)



@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(st.lists(st.tuples(_params | _penalised, _history, _history, st.booleans()), min_size=1,
                               max_size=6), min_size=1, max_size=3),
       vocab=st.sampled_from([7, 300, 3000]), one_pass=st.booleans(), seed=st.integers(0, 1000))
def test_staged_step_inputs_give_what_each_array_on_its_own_gives(steps, vocab, one_pass, seed):
    """A step's host inputs packed into a sampling staging area (the CUDA path: one buffer and one copy, a CPU
    tensor standing in for the device buffer, grown from 64 bytes) against each array a tensor of its own (the
    CPU's path): the same tokens, logprobs and generator states, unseeded rows included (the same global
    generator), step after step through both host buffers, one copy a step; rows whose newest token is pending
    count it from the device tokens."""
    staging = StagingArea(torch.device("cpu"), staged=True, nbytes=64)
    for k, specs in enumerate(steps, 1):
        logits = torch.randn(len(specs), vocab, generator=torch.Generator().manual_seed(seed + k)) * 3
        late = [i for i, spec in enumerate(specs) if spec[3]]
        pending = PendingTokens(torch.tensor([4] * len(specs) + [1] * len(late)),
                                {i: len(specs) + j for j, i in enumerate(late)}) if late else None
        results = []
        for stage in (staging, None):
            rows = [SamplingRow(p, prompt, output + ([PLACEHOLDER] if i in late else []),
                                make_generator(p.seed, i % 3) if p.seed is not None else None, [0])
                    for i, (p, prompt, output, _) in enumerate(specs)]
            torch.manual_seed(seed)
            sample = Sampler(all_logprobs=False).sample_on_device(logits, rows, one_pass, pending, stage)
            results.append((sample.pack(), sample.logprobs and (sample.logprobs.rows, sample.logprobs.top_n),
                            [r.generator.get_state() for r in rows if r.generator is not None]))
        (staged, staged_lp, staged_gens), (direct, direct_lp, direct_gens) = results
        assert staged.dtype == direct.dtype and torch.equal(staged, direct) and staged_lp == direct_lp
        assert all(torch.equal(a, b) for a, b in zip(staged_gens, direct_gens, strict=True))
        assert staging.copies == k


def test_logprobs_on_device_are_the_host_samplers_and_pack_into_one_buffer():
    """Unseeded and greedy rows with logprobs: the same tokens fed to both paths give the same numbers; the
    packed buffer (one float64 tensor: tokens, chosen logprobs, top values, top ids) reads back to them."""
    logits = torch.randn(5, 40, generator=torch.Generator().manual_seed(1)) * 2
    params = [SamplingParams(temperature=0.0, logprobs=3), SamplingParams(temperature=0.0),
              SamplingParams(temperature=0.0, logprobs=0), SamplingParams(temperature=0.0, logprobs=20),
              SamplingParams(temperature=0.0, logprobs=1, presence_penalty=2.0)]
    host = Sampler(all_logprobs=False)(logits, _rows(params))
    sample = Sampler(all_logprobs=False).sample_on_device(logits, _rows(params))
    packed = sample.pack()
    assert packed.dtype == torch.float64 and packed.shape == (5 + 4 + 2 * 4 * 20,)
    token_ids, sampled = sample.on_host()
    assert sampled == host and token_ids == [t.token_id for t in host]
    raw = torch.log_softmax(logits.double(), -1)
    assert abs(sampled[3].logprob - raw[3, token_ids[3]].item()) < 1e-5
    assert len(sampled[3].top_logprobs) == 20 and sampled[1] == sampler_module.SampledToken(token_ids[1], None, None)
    assert sampled[2].top_logprobs == {token_ids[2]: sampled[2].logprob}
    assert StepSample(sample.tokens).pack() is sample.tokens  # no logprobs: the int64 tokens as they are


def test_pending_tokens_are_the_rows_whose_newest_token_is_in_flight():
    rows = [SamplingRow(SamplingParams(), [1], out, None) for out in ([3, PLACEHOLDER], [], [PLACEHOLDER], [4])]
    tokens = torch.tensor([7, 8, 9])
    pending = pending_tokens(rows, [10, 11, 12, 13], tokens, {12: 0, 10: 2, 99: 1})
    assert pending.tokens is tokens and pending.rows == {0: 2, 2: 0}
    assert pending_tokens(rows[1:2] + rows[3:], [11, 13], None, {}) is None
    with pytest.raises(RuntimeError):
        pending_tokens(rows, [10, 11, 12, 13], None, {})

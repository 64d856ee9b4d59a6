"""The official `openai` client against a real mock-executor server: sync, async and streaming.

The sampling tests at the end run on a mock that returns logits (`sampling_server`), so the engine's real
sampler applies what the request asked for: each field must change the output the way the sampling recipe
(penalties, min_tokens, temperature, top-k/top-p/min-p, seeds, as OpenAI and vLLM define them) says.
"""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest
import torch
from server_proc import ServerProcess, http
from transformers import AutoTokenizer

from hetero_infer.worker.runner.loader import resolve_model
from hetero_infer.worker.runner.mock_executor import FAVOURITES, mock_logits


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=30)


MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}]


def test_models(client: openai.OpenAI, model_name: str) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [model_name]
    assert client.models.retrieve(model_name).id == model_name
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_completion(client: openai.OpenAI, model_name: str) -> None:
    r = client.completions.create(model=model_name, prompt="The capital of France is", max_tokens=7)
    assert r.object == "text_completion" and r.model == model_name
    assert len(r.choices) == 1
    choice = r.choices[0]
    assert choice.finish_reason == "length" and choice.text
    assert r.usage is not None
    assert r.usage.completion_tokens == 7
    assert r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + 7


def test_completion_stream_matches_non_stream(client: openai.OpenAI, model_name: str) -> None:
    full = client.completions.create(model=model_name, prompt="Once upon a time", max_tokens=12)
    stream = client.completions.create(model=model_name, prompt="Once upon a time", max_tokens=12, stream=True,
                                       stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 12
    assert all(c.usage is None for c in chunks[:-1])


def test_chat(client: openai.OpenAI, model_name: str) -> None:
    r = client.chat.completions.create(model=model_name, messages=MESSAGES, max_completion_tokens=6)
    assert r.object == "chat.completion"
    msg = r.choices[0].message
    assert msg.role == "assistant" and msg.content
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 6
    # max_tokens (deprecated) works too, and max_completion_tokens wins when both are given.
    r2 = client.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=3)
    assert r2.usage.completion_tokens == 3
    r3 = client.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=3, max_completion_tokens=5)
    assert r3.usage.completion_tokens == 5


def test_chat_stream(client: openai.OpenAI, model_name: str) -> None:
    full = client.chat.completions.create(model=model_name, messages=MESSAGES, max_completion_tokens=10)
    chunks = list(client.chat.completions.create(model=model_name, messages=MESSAGES, max_completion_tokens=10,
                                                 stream=True, stream_options={"include_usage": True}))
    content = [c for c in chunks if c.choices]
    assert content[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in content) == full.choices[0].message.content
    assert content[-1].choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == 10
    assert len({c.id for c in chunks}) == 1


def test_chat_stream_without_usage(client: openai.OpenAI, model_name: str) -> None:
    chunks = list(client.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=4, stream=True))
    assert all(c.choices for c in chunks) and chunks[-1].choices[0].finish_reason == "length"


async def test_async_client_concurrent(server: ServerProcess, model_name: str) -> None:
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=30)
    async with client:
        async def one(i: int) -> str:
            r = await client.chat.completions.create(
                model=model_name, messages=[{"role": "user", "content": f"Count to {i}"}], max_tokens=5)
            return r.choices[0].message.content or ""

        async def streamed(i: int) -> str:
            stream = await client.completions.create(model=model_name, prompt=f"item {i}", max_tokens=8, stream=True)
            return "".join([c.choices[0].text async for c in stream])

        results = await asyncio.gather(*[one(i) for i in range(16)], *[streamed(i) for i in range(16)])
    assert all(results)


def test_n_choices(client: openai.OpenAI, model_name: str) -> None:
    r = client.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=5, n=3)
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert r.usage.completion_tokens == 15
    chunks = list(client.completions.create(model=model_name, prompt="abc", max_tokens=5, n=3, stream=True))
    texts = {i: "".join(c.choices[0].text for c in chunks if c.choices[0].index == i) for i in range(3)}
    finished = {c.choices[0].index for c in chunks if c.choices[0].finish_reason}
    assert finished == {0, 1, 2} and all(texts.values())


def test_multiple_prompts_and_token_ids(client: openai.OpenAI, model_name: str) -> None:
    r = client.completions.create(model=model_name, prompt=["first prompt", "second prompt"], max_tokens=4, n=2)
    assert sorted(c.index for c in r.choices) == [0, 1, 2, 3]
    assert r.usage.completion_tokens == 16
    ids = client.completions.create(model=model_name, prompt=[1000, 2000, 3000], max_tokens=3)
    assert ids.usage.prompt_tokens == 3 and ids.usage.completion_tokens == 3
    batch = client.completions.create(model=model_name, prompt=[[1000, 2000], [3000]], max_tokens=2)
    assert batch.usage.prompt_tokens == 3 and len(batch.choices) == 2


def test_stop_string(client: openai.OpenAI, model_name: str) -> None:
    full = client.completions.create(model=model_name, prompt="stop test", max_tokens=30).choices[0].text
    assert len(full) > 6
    stop = full[3:6]
    r = client.completions.create(model=model_name, prompt="stop test", max_tokens=30, stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == full[: full.index(stop)]
    streamed = list(client.completions.create(model=model_name, prompt="stop test", max_tokens=30, stop=stop,
                                              stream=True))
    assert "".join(c.choices[0].text for c in streamed) == full[: full.index(stop)]
    assert streamed[-1].choices[0].finish_reason == "stop"


def test_echo(client: openai.OpenAI, model_name: str) -> None:
    plain = client.completions.create(model=model_name, prompt="Echo me", max_tokens=3).choices[0].text
    echoed = client.completions.create(model=model_name, prompt="Echo me", max_tokens=3, echo=True).choices[0].text
    assert echoed == "Echo me" + plain


def test_logprobs_fields_are_accepted(client: openai.OpenAI, model_name: str) -> None:
    # Logprob values themselves are checked with the real model (test_real_model.py): the mock samples none.
    r = client.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=3, logprobs=True,
                                       top_logprobs=2)
    assert r.choices[0].logprobs is not None and isinstance(r.choices[0].logprobs.content, list)
    c = client.completions.create(model=model_name, prompt="logprobs", max_tokens=3, logprobs=2)
    assert c.choices[0].logprobs is not None
    plain = client.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=3)
    assert plain.choices[0].logprobs is None


def test_health_endpoints(server: ServerProcess) -> None:
    assert http("GET", server.url + "/healthz").json() == {"status": "ok"}
    assert http("GET", server.url + "/readyz").json() == {"status": "ready"}
    spec = http("GET", server.url + "/openapi.json").json()
    assert {"/v1/completions", "/v1/chat/completions", "/v1/models", "/healthz", "/readyz", "/metrics"} <= set(
        spec["paths"])


# ------------------------------------------------------------------------ sampling (a mock that returns logits)
#
# The mock's distribution (mock_executor.mock_logits): fixed pseudo-random logits in [0, 4) over the whole
# vocabulary, the FAVOURITES at 8.0, 7.7, 7.4, ... (greedy repeats FAVOURITES[0]; penalties walk down the list),
# and a copy bonus that lets a prompt script a token (e.g. EOS). The reference below is the documented
# recipe (OpenAI's presence/frequency penalties on output counts, HF's repetition penalty on prompt + output,
# vLLM's min_tokens masking, then argmax), written here independently of the engine's sampler.

PROMPT = [5000, 5001, 5002]  # distinct ordinary tokens, none a favourite: no copy bonus


@pytest.fixture(scope="module")
def hf_tokenizer() -> Any:
    """transformers' tokenizer of the default model: the reference for texts and EOS."""
    return AutoTokenizer.from_pretrained(resolve_model(None)[0])


@pytest.fixture(scope="module")
def sclient(sampling_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=sampling_server.base_url, api_key="unused", max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def smodel(sampling_server: ServerProcess) -> str:
    return http("GET", sampling_server.base_url + "/models").json()["data"][0]["id"]


def reference_greedy(prompt: list[int], max_tokens: int, eos: int, vocab: int, *, presence: float = 0.0,
                     frequency: float = 0.0, repetition: float = 1.0, min_tokens: int = 0,
                     stop_token_ids: tuple[int, ...] = (), ignore_eos: bool = False,
                     logit_bias: dict[int, float] | None = None) -> tuple[list[int], str]:
    """Greedy decoding of the mock's logits under the documented penalty, bias and stopping rules."""
    out: list[int] = []
    while len(out) < max_tokens:
        x = mock_logits(prompt, prompt + out, vocab).double().tolist()
        for t, b in (logit_bias or {}).items():
            x[t] += b
        for t in set(prompt + out):
            x[t] = x[t] / repetition if x[t] > 0 else x[t] * repetition
        for t in set(out):
            x[t] -= frequency * out.count(t) + presence
        if len(out) < min_tokens:
            for t in (*stop_token_ids, *(() if ignore_eos else (eos,))):
                x[t] = float("-inf")
        token = max(range(vocab), key=x.__getitem__)
        out.append(token)
        if len(out) >= min_tokens and ((token == eos and not ignore_eos) or token in stop_token_ids):
            return out, "stop"
    return out, "length"


def _complete(client: openai.OpenAI, model: str, prompt: list[int] = PROMPT, **kw: Any) -> Any:
    extra = {k: kw.pop(k) for k in ("top_k", "min_p", "repetition_penalty", "min_tokens", "stop_token_ids",
                                    "ignore_eos", "skip_special_tokens", "include_stop_str_in_output") if k in kw}
    return client.completions.create(model=model, prompt=prompt, extra_body=extra or None, **kw).choices[0]


PENALTIES = {
    "none": {},
    "presence": {"presence_penalty": 1.0},
    "frequency": {"frequency_penalty": 1.0},
    "repetition": {"repetition_penalty": 1.5},
    "negative presence": {"presence_penalty": -1.0, "frequency_penalty": 0.5},
}
_REF_NAMES = {"presence_penalty": "presence", "frequency_penalty": "frequency", "repetition_penalty": "repetition"}


def test_penalties_follow_the_recipe(sclient: openai.OpenAI, smodel: str, hf_tokenizer: Any) -> None:
    eos, vocab = hf_tokenizer.eos_token_id, len(hf_tokenizer)
    expected = {name: reference_greedy(PROMPT, 10, eos, vocab, **{_REF_NAMES[k]: v for k, v in kw.items()})[0]
                for name, kw in PENALTIES.items()}
    # Every setting leads somewhere else: a dropped or swapped penalty cannot match its reference.
    assert len({tuple(v) for v in expected.values()}) == len(PENALTIES), expected
    for name, kw in PENALTIES.items():
        got = _complete(sclient, smodel, max_tokens=10, temperature=0.0, **kw)
        assert got.text == hf_tokenizer.decode(expected[name]), name


def test_stop_token_ids_and_min_tokens(sclient: openai.OpenAI, smodel: str, hf_tokenizer: Any) -> None:
    eos, vocab = hf_tokenizer.eos_token_id, len(hf_tokenizer)
    for min_tokens in (0, 3):
        ids, reason = reference_greedy(PROMPT, 10, eos, vocab, presence=1.0, min_tokens=min_tokens,
                                       stop_token_ids=(FAVOURITES[1],))
        got = _complete(sclient, smodel, max_tokens=10, temperature=0.0, presence_penalty=1.0,
                        min_tokens=min_tokens, stop_token_ids=[FAVOURITES[1]])
        # as vLLM: the stop token's text is left out of the output (issue 15, defect 6) ...
        assert (got.finish_reason, got.text) == (reason, hf_tokenizer.decode(ids[:-1])), min_tokens
        assert reason == "stop" and len(ids) == (2 if min_tokens == 0 else min_tokens + 1)
        kept = _complete(sclient, smodel, max_tokens=10, temperature=0.0, presence_penalty=1.0,
                         min_tokens=min_tokens, stop_token_ids=[FAVOURITES[1]], include_stop_str_in_output=True)
        assert kept.text == hf_tokenizer.decode(ids)  # ... unless include_stop_str_in_output asks for it


def test_eos_ignore_eos_and_special_tokens(sclient: openai.OpenAI, smodel: str, hf_tokenizer: Any) -> None:
    eos = hf_tokenizer.eos_token_id
    scripted = [5000, eos, 5000]  # the copy bonus puts EOS next; after it, FAVOURITES[0] again and again
    stopped = _complete(sclient, smodel, prompt=scripted, max_tokens=6, temperature=0.0)
    assert stopped.finish_reason == "stop" and stopped.text == ""
    at_least = _complete(sclient, smodel, prompt=scripted, max_tokens=6, temperature=0.0, min_tokens=2)
    assert at_least.finish_reason == "length"  # EOS masked at first, then the mock has nothing to copy it from
    kept = _complete(sclient, smodel, prompt=scripted, max_tokens=6, temperature=0.0, ignore_eos=True)
    assert kept.finish_reason == "length" and kept.text == hf_tokenizer.decode([FAVOURITES[0]] * 5)
    shown = _complete(sclient, smodel, prompt=scripted, max_tokens=6, temperature=0.0, ignore_eos=True,
                      skip_special_tokens=False)
    assert shown.text == hf_tokenizer.decode([eos] + [FAVOURITES[0]] * 5)


def test_stop_string_inclusion(sclient: openai.OpenAI, smodel: str, hf_tokenizer: Any) -> None:
    first, second = hf_tokenizer.decode([FAVOURITES[0]]), hf_tokenizer.decode([FAVOURITES[1]])
    cut = _complete(sclient, smodel, max_tokens=10, temperature=0.0, presence_penalty=1.0, stop=[second])
    assert (cut.finish_reason, cut.text) == ("stop", first)
    kept = _complete(sclient, smodel, max_tokens=10, temperature=0.0, presence_penalty=1.0, stop=[second],
                     include_stop_str_in_output=True)
    assert (kept.finish_reason, kept.text) == ("stop", first + second)


def test_filters_that_leave_one_token_are_greedy(sclient: openai.OpenAI, smodel: str) -> None:
    greedy = _complete(sclient, smodel, max_tokens=8, temperature=0.0).text
    sampled = _complete(sclient, smodel, max_tokens=8, seed=7).text
    assert sampled != greedy  # at temperature 1 the mock's favourites hold well under 1% of the mass
    for kw in ({"top_k": 1}, {"min_p": 1.0}, {"top_p": 1e-4}, {"temperature": 0.02}):
        assert _complete(sclient, smodel, max_tokens=8, seed=7, **kw).text == greedy, kw


def _sampled_tokens(client: openai.OpenAI, model: str, **kw: Any) -> list[str]:
    choice = _complete(client, model, max_tokens=24, seed=11, logprobs=0, **kw)
    return choice.logprobs.tokens


def test_top_k_top_p_min_p_keep_their_candidates(sclient: openai.OpenAI, smodel: str, hf_tokenizer: Any) -> None:
    top3 = {hf_tokenizer.decode([t]) for t in FAVOURITES[:3]}
    probs = torch.softmax(mock_logits(PROMPT, PROMPT, len(hf_tokenizer)).double(), -1)
    c2, c3 = probs[list(FAVOURITES[:2])].sum().item(), probs[list(FAVOURITES[:3])].sum().item()
    unfiltered = _sampled_tokens(sclient, smodel)
    assert not set(unfiltered) <= top3
    # min_p 0.5 keeps the tokens at least half as likely as the top one: FAVOURITES[:3] (exp(-0.3 k) >= 0.5).
    for kw in ({"top_k": 3}, {"top_p": (c2 + c3) / 2}, {"min_p": 0.5}):
        tokens = _sampled_tokens(sclient, smodel, **kw)
        assert set(tokens) <= top3 and len(set(tokens)) > 1, (kw, tokens)


def test_seed(sclient: openai.OpenAI, smodel: str) -> None:
    a, b = (_complete(sclient, smodel, max_tokens=8, seed=1).text for _ in range(2))
    c = _complete(sclient, smodel, max_tokens=8, seed=2).text
    assert a == b != c
    assert _complete(sclient, smodel, max_tokens=8).text != _complete(sclient, smodel, max_tokens=8).text
    r1, r2 = (sclient.completions.create(model=smodel, prompt=PROMPT, max_tokens=8, n=3, seed=5) for _ in range(2))
    texts = [c.text for c in sorted(r1.choices, key=lambda c: c.index)]
    assert texts == [c.text for c in sorted(r2.choices, key=lambda c: c.index)]
    assert len(set(texts)) == 3 and a not in texts


def test_completion_logprobs_are_the_models(sclient: openai.OpenAI, smodel: str, hf_tokenizer: Any) -> None:
    ref = torch.log_softmax(mock_logits(PROMPT, PROMPT, len(hf_tokenizer)).double(), -1)
    top = {hf_tokenizer.decode([t]): ref[t].item() for t in FAVOURITES[:3]}
    lp = _complete(sclient, smodel, max_tokens=4, temperature=0.0, logprobs=3).logprobs
    assert lp.tokens == [hf_tokenizer.decode([FAVOURITES[0]])] * 4
    for d, chosen in zip(lp.top_logprobs, lp.token_logprobs, strict=True):
        assert d.keys() == top.keys() and all(d[k] == pytest.approx(v, abs=1e-4) for k, v in top.items())
        assert chosen == pytest.approx(top[lp.tokens[0]], abs=1e-4)


def test_chat_sampling_fields(sclient: openai.OpenAI, smodel: str) -> None:
    def chat(**kw: Any) -> Any:
        extra = {k: kw.pop(k) for k in ("top_k", "repetition_penalty") if k in kw}
        return sclient.chat.completions.create(model=smodel, messages=MESSAGES, max_completion_tokens=8,
                                               extra_body=extra or None, **kw)

    def text(**kw: Any) -> str:
        return chat(**kw).choices[0].message.content

    greedy = text(temperature=0.0)
    assert text(seed=3, top_k=1) == greedy != text(seed=3)
    assert text(seed=3) == text(seed=3) != text(seed=4)
    penalised = {text(temperature=0.0, **kw) for kw in PENALTIES.values()}
    assert len(penalised) == len(PENALTIES)
    r = chat(temperature=0.0, logprobs=True, top_logprobs=4)
    assert [len(t.top_logprobs) for t in r.choices[0].logprobs.content] == [4] * 8
    r = chat(temperature=0.0, logprobs=True)
    assert [len(t.top_logprobs) for t in r.choices[0].logprobs.content] == [0] * 8


@pytest.mark.parametrize("bias", [{FAVOURITES[0]: -100.0}, {FAVOURITES[0]: -100.0, FAVOURITES[1]: -3.0},
                                  {7000: 20.0}, {7000: 12.0, 7001: 11.5}])
def test_logit_bias(sclient: openai.OpenAI, smodel: str, hf_tokenizer: Any, bias: dict[int, float]) -> None:
    """OpenAI's logit_bias (token-id strings -> bias added to the logit) against the greedy reference."""
    eos, vocab = hf_tokenizer.eos_token_id, len(hf_tokenizer)
    ids, reason = reference_greedy(PROMPT, 6, eos, vocab, presence=0.5, logit_bias=bias)
    unbiased, _ = reference_greedy(PROMPT, 6, eos, vocab, presence=0.5)
    assert ids != unbiased  # the bias matters
    got = _complete(sclient, smodel, max_tokens=6, temperature=0.0, presence_penalty=0.5,
                    logit_bias={str(t): b for t, b in bias.items()})
    assert (got.finish_reason, got.text) == (reason, hf_tokenizer.decode(ids))


def test_best_of_returns_the_n_most_likely(sclient: openai.OpenAI, smodel: str) -> None:
    r = sclient.completions.create(model=smodel, prompt=PROMPT, max_tokens=5, temperature=1.0, seed=3, n=2,
                                   best_of=4, logprobs=0, extra_body={"ignore_eos": True})
    assert sorted(c.index for c in r.choices) == [0, 1]
    totals = [sum(c.logprobs.token_logprobs) for c in sorted(r.choices, key=lambda c: c.index)]
    assert totals[0] >= totals[1]
    with pytest.raises(openai.BadRequestError):
        sclient.completions.create(model=smodel, prompt=PROMPT, max_tokens=5, n=3, best_of=2)


def test_echo_with_logprobs_scores_the_prompt(sclient: openai.OpenAI, smodel: str) -> None:
    """lm-evaluation-harness's loglikelihood request (echo, logprobs=1, max_tokens=1, temperature 0): the prompt's
    tokens with their logprobs (the first one's null) ahead of the generated token's, here under the mock's own
    distribution (`mock_logits`, which the generated token's logprob follows too), through the engine process;
    streamed, the first chunk carries the same."""
    tok = AutoTokenizer.from_pretrained(resolve_model(None)[0])
    ids = tok.encode("Score these words, please")
    body = {"model": smodel, "prompt": ids, "max_tokens": 1, "echo": True, "logprobs": 1, "temperature": 0}
    r = sclient.completions.create(**body)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(ids) + 1 and lp.tokens[: len(ids)] == [tok.decode([t]) for t in ids]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    for i in range(1, len(ids)):
        row = mock_logits(ids, ids[:i], len(tok)).double().log_softmax(-1)
        assert lp.token_logprobs[i] == pytest.approx(row[ids[i]].item(), abs=1e-5)
        assert len(lp.top_logprobs[i]) == 1
    assert lp.text_offset[: len(ids)] == sorted(lp.text_offset[: len(ids)]) and lp.text_offset[0] == 0
    assert r.choices[0].text.startswith(tok.decode(ids))
    first = next(c for c in sclient.completions.create(**body, stream=True) if c.choices)
    assert first.choices[0].logprobs.tokens == lp.tokens
    assert first.choices[0].logprobs.token_logprobs == lp.token_logprobs
    generated = mock_logits(ids, ids, len(tok)).double().log_softmax(-1)
    assert lp.token_logprobs[-1] == pytest.approx(generated.max().item(), abs=1e-5)  # greedy
    two = sclient.completions.create(**{**body, "n": 2})  # n choices share the prompt's part
    assert [c.logprobs.token_logprobs for c in two.choices] == [lp.token_logprobs] * 2
    plain = sclient.completions.create(**{**body, "echo": False})  # without echo: the generated token's only
    assert plain.choices[0].logprobs.token_logprobs == lp.token_logprobs[-1:]


def test_vllm_prompt_logprobs_field(sclient: openai.OpenAI, smodel: str) -> None:
    """vLLM's `prompt_logprobs` request field (extra_body): the non-streamed response carries, per prompt token,
    null (the first) or {token id: {logprob, rank, decoded_token}} of the top N and of the prompt token itself
    (its rank: the tokens at least as likely), in each completions choice and at the top of a chat response;
    echo with logprobs brings them too (as vLLM); a stream refuses them (but for 0, dropped)."""
    tok = AutoTokenizer.from_pretrained(resolve_model(None)[0])
    ids = tok.encode("Rank these prompt tokens")

    def check(got: list, prompt: list[int], k: int) -> None:
        assert len(got) == len(prompt) and got[0] is None
        for i in range(1, len(prompt)):
            row = mock_logits(prompt, prompt[:i], len(tok)).double().log_softmax(-1)
            top = row.topk(k).indices.tolist() if k else []
            assert set(got[i]) == {str(t) for t in top} | {str(prompt[i])}, i
            mine = got[i][str(prompt[i])]
            assert mine["logprob"] == pytest.approx(row[prompt[i]].item(), abs=1e-5)
            assert mine["rank"] == int((row >= row[prompt[i]] - 1e-6).sum()), i
            assert mine["decoded_token"] == tok.decode([prompt[i]], skip_special_tokens=False)
            for r, t in enumerate(top, start=1):
                assert got[i][str(t)]["logprob"] == pytest.approx(row[t].item(), abs=1e-5)
                if t != prompt[i]:
                    assert got[i][str(t)]["rank"] == r

    r = sclient.completions.create(model=smodel, prompt=ids, max_tokens=1, temperature=0, n=2,
                                   extra_body={"prompt_logprobs": 3})
    assert [c.model_extra["prompt_logprobs"] for c in r.choices][0] == r.choices[1].model_extra["prompt_logprobs"]
    check(r.choices[0].model_extra["prompt_logprobs"], ids, 3)
    assert r.choices[0].logprobs is None
    echoed = sclient.completions.create(model=smodel, prompt=ids, max_tokens=1, temperature=0, echo=True, logprobs=2)
    check(echoed.choices[0].model_extra["prompt_logprobs"], ids, 2)
    plain = sclient.completions.create(model=smodel, prompt=ids, max_tokens=1, temperature=0)
    assert "prompt_logprobs" not in (plain.choices[0].model_extra or {})

    messages = [{"role": "user", "content": "Rank me"}]
    chat = sclient.chat.completions.create(model=smodel, messages=messages, max_tokens=1, temperature=0,
                                           extra_body={"prompt_logprobs": 0})
    chat_ids = tok.apply_chat_template(messages, add_generation_prompt=True)
    chat_ids = chat_ids["input_ids"] if isinstance(chat_ids, dict) or hasattr(chat_ids, "keys") else chat_ids
    check(chat.model_extra["prompt_logprobs"], list(chat_ids), 0)

    with pytest.raises(openai.BadRequestError) as info:
        sclient.completions.create(model=smodel, prompt=ids, max_tokens=1, stream=True,
                                   extra_body={"prompt_logprobs": 1})
    assert info.value.body["param"] == "prompt_logprobs"
    streamed = list(sclient.chat.completions.create(model=smodel, messages=messages, max_tokens=1, stream=True,
                                                    extra_body={"prompt_logprobs": 0}))
    assert streamed and all("prompt_logprobs" not in (c.model_extra or {}) for c in streamed)
    for bad in (-1, 21):
        with pytest.raises(openai.BadRequestError) as info:
            sclient.completions.create(model=smodel, prompt=ids, max_tokens=1, extra_body={"prompt_logprobs": bad})
        assert info.value.body["param"] == "prompt_logprobs"


def test_echo_alone_with_max_tokens_0(sclient: openai.OpenAI, smodel: str) -> None:
    """echo with max_tokens 0 (vLLM's echo without generation, OpenAI's legacy scoring call): the prompt and its
    logprobs, nothing generated (no text, no token, no completion tokens), streamed or not; max_tokens 0 without
    echo is a 400."""
    tok = AutoTokenizer.from_pretrained(resolve_model(None)[0])
    ids = tok.encode("Only score this prompt")
    body = {"model": smodel, "prompt": ids, "echo": True, "logprobs": 1, "temperature": 0}
    alone = sclient.completions.create(**body, max_tokens=0)
    scored = sclient.completions.create(**body, max_tokens=1)
    c = alone.choices[0]
    assert c.text == tok.decode(ids) and scored.choices[0].text.startswith(c.text) and len(scored.choices[0].text) > len(c.text)
    assert c.logprobs.tokens == scored.choices[0].logprobs.tokens[: len(ids)] and len(c.logprobs.tokens) == len(ids)
    assert c.logprobs.token_logprobs == scored.choices[0].logprobs.token_logprobs[: len(ids)]
    assert c.finish_reason == "length" and alone.usage.completion_tokens == 0
    assert alone.usage.prompt_tokens == len(ids)
    chunks = [ch for ch in sclient.completions.create(**body, max_tokens=0, stream=True) if ch.choices]
    assert "".join(ch.choices[0].text for ch in chunks) == c.text
    assert [t for ch in chunks if ch.choices[0].logprobs for t in ch.choices[0].logprobs.tokens] == c.logprobs.tokens
    with pytest.raises(openai.BadRequestError) as info:
        sclient.completions.create(model=smodel, prompt=ids, max_tokens=0)
    assert info.value.body["param"] == "max_tokens"

"""`hetero-infer serve` with the real default model (torch executor, CPU) and the official client."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from server_proc import ServerProcess

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def real() -> Iterator[ServerProcess]:
    s = ServerProcess("--max-model-len", "512", executor="torch", start_timeout=300)
    yield s
    assert s.stop() == 0, s.log()


@pytest.fixture(scope="module")
def client(real: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=real.base_url, api_key="unused", max_retries=0, timeout=120)


def test_greedy_chat_answers(client: openai.OpenAI) -> None:
    model = client.models.list().data[0].id
    r = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=8, temperature=0)
    assert "Paris" in (r.choices[0].message.content or "")
    streamed = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=8, temperature=0,
                                              stream=True, stream_options={"include_usage": True})
    chunks = list(streamed)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == r.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens


def test_logprobs(client: openai.OpenAI) -> None:
    model = client.models.list().data[0].id
    r = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=3, temperature=0, logprobs=True,
                                       top_logprobs=3, extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert len(content) == 3
    for entry in content:
        assert entry.logprob <= 0.0 and len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[-1].logprob
        assert entry.token == entry.top_logprobs[0].token  # greedy: the sampled token is the most likely
    assert "".join(e.token for e in content) == r.choices[0].message.content
    c = client.completions.create(model=model, prompt="The capital of France is", max_tokens=3, temperature=0,
                                  logprobs=2, extra_body={"ignore_eos": True})
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 3
    assert all(len(t) == 2 for t in lp.top_logprobs)
    assert lp.text_offset[0] == 0 and "".join(lp.tokens) == c.choices[0].text


def test_seeded_sampling_is_reproducible(client: openai.OpenAI) -> None:
    model = client.models.list().data[0].id

    def sample(seed: int) -> list[str]:
        r = client.completions.create(model=model, prompt="My favourite animal is", max_tokens=4, temperature=1.0,
                                      top_p=0.95, seed=seed, n=2)
        return [c.text for c in sorted(r.choices, key=lambda c: c.index)]

    assert sample(7) == sample(7)


def test_echo_with_logprobs_equals_transformers(client: openai.OpenAI) -> None:
    """The prompt's logprobs through the API (echo with logprobs, as evaluation harnesses score a continuation)
    against transformers' log-softmax of the same float32 model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hetero_infer.worker.runner.loader import resolve_model

    folder = resolve_model(None)[0]
    ids = AutoTokenizer.from_pretrained(folder).encode("The capital of France is Paris")
    model = client.models.list().data[0].id
    r = client.completions.create(model=model, prompt=ids, max_tokens=1, echo=True, logprobs=2, temperature=0)
    lp = r.choices[0].logprobs
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.inference_mode():
        reference = hf(torch.tensor([ids])).logits[0].double().log_softmax(-1)
    assert lp.token_logprobs[0] is None and len(lp.token_logprobs) == len(ids) + 1
    for i in range(1, len(ids)):
        assert lp.token_logprobs[i] == pytest.approx(reference[i - 1, ids[i]].item(), abs=1e-4), i
        assert sorted(lp.top_logprobs[i].values(), reverse=True) == pytest.approx(
            reference[i - 1].topk(2).values.tolist(), abs=1e-4)
    # the generated token: greedy, transformers' argmax after the whole prompt
    assert lp.token_logprobs[-1] == pytest.approx(reference[-1].max().item(), abs=1e-4)


def test_vllm_prompt_logprobs_equal_transformers(client: openai.OpenAI) -> None:
    """vLLM's `prompt_logprobs` field on a chat request: the chat prompt's tokens' logprobs and ranks against
    transformers' log-softmax of the same float32 model, the top 2 at each position among them."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hetero_infer.worker.runner.loader import resolve_model

    folder = resolve_model(None)[0]
    tok = AutoTokenizer.from_pretrained(folder)
    ids = tok.apply_chat_template(QUESTION, add_generation_prompt=True, return_dict=True)["input_ids"]
    model = client.models.list().data[0].id
    r = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=1, temperature=0,
                                       extra_body={"prompt_logprobs": 2})
    got = r.model_extra["prompt_logprobs"]
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.inference_mode():
        reference = hf(torch.tensor([ids])).logits[0].double().log_softmax(-1)
    assert len(got) == len(ids) and got[0] is None
    for i in range(1, len(ids)):
        row, mine = reference[i - 1], got[i][str(ids[i])]
        assert mine["logprob"] == pytest.approx(row[ids[i]].item(), abs=1e-4), i
        assert int((row > row[ids[i]] + 1e-4).sum()) < mine["rank"] <= int((row >= row[ids[i]] - 1e-4).sum()), i
        assert mine["decoded_token"] == tok.decode([ids[i]])
        top = [v for key, v in got[i].items() if key != str(ids[i]) or v["rank"] <= 2]
        assert sorted(v["logprob"] for v in top)[::-1][:2] == pytest.approx(row.topk(2).values.tolist(), abs=1e-4)

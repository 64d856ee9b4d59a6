"""Structured outputs and logit_bias on the real default model (SmolLM2-135M-Instruct) through the public API:
`from hetero_infer import LLM, SamplingParams, StructuredOutputsParams`. Outputs are parsed with `json` and
validated with `jsonschema`, regexes checked with `re`; logit_bias against the unbiased run's own logprobs.
The default suite decodes one batch; the sweep (whitespace allowed, sampling, n > 1, a small KV pool that
preempts) is `slow`."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from hetero_infer import LLM, SamplingParams, StructuredOutputsParams

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 20},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "role": {"enum": ["admin", "user", "guest"]}},
    "required": ["name", "age", "role"]}
ORDER = {"type": "object", "properties": {
    "id": {"type": "integer", "minimum": 0, "maximum": 99999},
    "items": {"type": "array", "minItems": 1, "maxItems": 3,
              "items": {"type": "object", "properties": {"sku": {"type": "string", "maxLength": 8},
                                                         "qty": {"type": "integer", "minimum": 1, "maximum": 99}},
                        "required": ["sku", "qty"]}},
    "paid": {"type": "boolean"}},
    "required": ["id", "items", "paid"]}
CITY = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 20},
    "country": {"enum": ["France", "Germany", "Italy", "Spain"]},
    "population_millions": {"type": "number", "minimum": 0, "maximum": 100},
    "landmarks": {"type": "array", "items": {"type": "string", "maxLength": 24}, "maxItems": 2}},
    "required": ["city", "country", "landmarks"]}
DATE = r"\d{4}-\d{2}-\d{2}"


def ask(question: str) -> list[dict]:
    return [{"role": "user", "content": question}]


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(max_model_len=1024)


def params(max_tokens: int = 80, **constraint) -> SamplingParams:
    sampling = {k: constraint.pop(k) for k in ("temperature", "seed", "n", "top_p") if k in constraint}
    sampling.setdefault("temperature", 0.0)
    constraint.setdefault("disable_any_whitespace", True)
    return SamplingParams(max_tokens=max_tokens, structured_outputs=StructuredOutputsParams(**constraint),
                          **sampling)


def check_json(output, schema) -> None:
    for sample in output.outputs:
        assert sample.finish_reason == "stop", sample.text
        jsonschema.validate(json.loads(sample.text), schema)


def test_one_batch_of_schemas_regex_and_choice(llm):
    requests = [
        (ask("Describe a user of a web shop as JSON."), params(json=PERSON)),
        (ask("Give me an order as JSON."), params(json=ORDER)),
        (ask("Tell me about Paris as JSON."), params(json=CITY, temperature=0.8, seed=3, n=2)),
        (ask("When did the Berlin wall fall? Answer with a date."), params(regex=DATE)),
        (ask("Is the sky blue? Answer yes or no."), params(choice=["yes", "no"])),
    ]
    outs = _batched(llm, requests)
    check_json(outs[0], PERSON)
    check_json(outs[1], ORDER)
    check_json(outs[2], CITY)
    assert len(outs[2].outputs) == 2
    assert re.fullmatch(DATE, outs[3].outputs[0].text)
    assert outs[4].outputs[0].text in ("yes", "no")


def _batched(llm: LLM, requests: list) -> list:
    """One `LLM.chat` call: the engine decodes the requests together, each with its own params."""
    return llm.chat([m for m, _ in requests], [p for _, p in requests])


def test_logit_bias_forces_and_bans_against_the_unbiased_logprobs(llm):
    prompt = llm.engine.tokenizer.apply_chat_template(ask("Name a colour."))
    base = llm.generate(prompt_token_ids=[prompt], sampling_params=SamplingParams(
        temperature=0.0, max_tokens=1, logprobs=5))[0].outputs[0]
    ranked = sorted(base.logprobs[0].items(), key=lambda kv: -kv[1])
    first, second = ranked[0][0], ranked[1][0]
    assert base.token_ids[0] == first
    banned = llm.generate(prompt_token_ids=[prompt], sampling_params=SamplingParams(
        temperature=0.0, max_tokens=1, logit_bias={first: -100.0}))[0].outputs[0]
    assert banned.token_ids[0] == second
    forced_token = ranked[-1][0]
    forced = llm.generate(prompt_token_ids=[prompt], sampling_params=SamplingParams(
        temperature=1.0, seed=0, max_tokens=4, ignore_eos=True, logit_bias={forced_token: 100.0}))[0].outputs[0]
    assert forced.token_ids == [forced_token] * 4


@pytest.mark.slow
@pytest.mark.parametrize("whitespace", [False, True])
def test_sweep_sampled_n_and_whitespace(llm, whitespace):
    schemas = [PERSON, ORDER, CITY]
    requests = [(ask(f"Reply with JSON, example {i}."), params(
        json=schema, temperature=1.0, seed=i, n=3, max_tokens=200, disable_any_whitespace=not whitespace))
        for i, schema in enumerate(schemas)]
    for out, schema in zip(_batched(llm, requests), schemas, strict=True):
        assert len(out.outputs) == 3
        check_json(out, schema)


@pytest.mark.slow
def test_sweep_under_preemption():
    small = LLM(max_model_len=512, max_num_blocks=12, block_size=16, max_num_seqs=8)
    requests = [(ask(f"Describe user number {i} as JSON."), params(json=PERSON, temperature=0.7, seed=i, n=2))
                for i in range(6)]
    outs = _batched(small, requests)
    assert small.engine.stats().num_preemptions_total > 0
    for out in outs:
        check_json(out, PERSON)

"""Structured outputs through the engine, on the mock executor's pseudo-random logits (`mock_logits`: the real
sampler, the default model's tokenizer, no forward pass): every output parses and validates against its JSON
schema (checked with `jsonschema`), matches its regex or is one of its choices, for greedy, seeded and n > 1
requests, also when a small KV pool preempts them; each sequence's grammar state is freed with it."""

from __future__ import annotations

import gc
import json
import pickle
import re
import weakref

import jsonschema
import pytest

from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.contracts.sampling_params import SamplingParams, StructuredOutputsParams
from hetero_infer.worker.core.engine import LLMEngine

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "role": {"enum": ["admin", "user", "guest"]},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
    "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                                 "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["city", "zip"]}},
    "required": ["name", "age", "role", "tags", "address"]}
FLAGS = {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 4}
PHONE = r"\(\d{3}\) \d{3}-\d{4}"


def mock_engine(**overrides) -> LLMEngine:
    config = dict(executor="mock", mock_logits=True, max_model_len=512, max_num_blocks=512, block_size=4,
                  max_num_seqs=16)
    return LLMEngine(EngineConfig(**(config | overrides)))


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    return mock_engine()


def run(engine: LLMEngine) -> dict:
    outputs = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs[out.request_id] = out
    return outputs


def so(**kwargs) -> SamplingParams:
    constraint = StructuredOutputsParams(**{k: kwargs.pop(k) for k in list(kwargs)
                                            if k in ("json", "regex", "choice", "json_object",
                                                     "disable_any_whitespace")})
    return SamplingParams(max_tokens=kwargs.pop("max_tokens", 300), structured_outputs=constraint, **kwargs)


def assert_valid(out, schema) -> None:
    for sample in out.outputs:
        assert sample.finish_reason == "stop", sample  # ended by EOS, which the grammar allowed only at the end
        jsonschema.validate(json.loads(sample.text), schema)


@pytest.mark.parametrize("sampling", [dict(temperature=0.0), dict(temperature=1.0, seed=7),
                                      dict(temperature=0.8, top_k=50, seed=3, n=3)])
def test_json_schemas_always_validate(engine, sampling):
    cases = {"person": PERSON, "flags": FLAGS}
    for i, (name, schema) in enumerate(cases.items()):
        engine.add_request(name, None, [1, 20 + i, 30], so(json=schema, disable_any_whitespace=True, **sampling))
    outputs = run(engine)
    for name, schema in cases.items():
        assert len(outputs[name].outputs) == sampling.get("n", 1)
        assert_valid(outputs[name], schema)


def test_regex_and_choice(engine):
    engine.add_request("phone", None, [1, 2, 3], so(regex=PHONE, temperature=1.0, seed=1, n=2))
    engine.add_request("pick", None, [1, 2, 4], so(choice=["red", "green", "blue"], temperature=1.0, n=4, seed=2))
    outputs = run(engine)
    assert all(re.fullmatch(PHONE, s.text) for s in outputs["phone"].outputs)
    assert all(s.text in ("red", "green", "blue") for s in outputs["pick"].outputs)


def test_greedy_constrained_output_is_the_reference_walk(engine):
    # Reference: the mock's logits masked by hand to the choices' continuations, one token at a time.
    from hetero_infer.worker.runner.mock_executor import mock_logits

    choices = ["alpha", "beta", "gamma"]
    prompt = [1, 5, 9]
    engine.add_request("g", None, prompt, so(choice=choices, temperature=0.0))
    [out] = run(engine).values()
    tok = engine.tokenizer
    pieces = tok.hf.batch_decode([[t] for t in range(engine.vocab_size)])
    tokens, text = list(prompt), ""
    while text not in choices:
        logits = mock_logits(prompt, tokens, engine.vocab_size)
        allowed = [t for t, piece in enumerate(pieces) if t not in tok.eos_token_ids and piece
                   and any(c.startswith(text + piece) for c in choices)]
        best = max(allowed, key=lambda t: logits[t].item())
        tokens.append(best)
        text += pieces[best]
    assert out.outputs[0].text == text
    assert out.outputs[0].token_ids[:-1] == tokens[len(prompt):]


def test_constraints_survive_preemption():
    engine = mock_engine(max_num_blocks=24, block_size=4, max_num_seqs=8)
    for i in range(6):
        engine.add_request(f"r{i}", None, [1, 2, 3, 4 + i],
                           so(json=FLAGS, disable_any_whitespace=True, temperature=1.0, seed=i, n=2, max_tokens=60))
    outputs = run(engine)
    assert engine.stats().num_preemptions_total > 0
    for out in outputs.values():
        assert_valid(out, FLAGS)


def test_constrained_and_seeded_steps_cross_to_the_executor_as_data():
    """The executor gets pickled copies of each step (its plan and sampling rows: a grammar row's token bitmask,
    a seeded row's seed), as an executor in another process would: the same outputs as the engine handing over
    its own objects, valid, under preemption too."""

    def outputs(copied: bool) -> dict:
        engine = mock_engine(max_num_blocks=24, block_size=4, max_num_seqs=8)
        if copied:
            launch = engine.executor.execute_async
            engine.executor.execute_async = lambda plan, rows: launch(*pickle.loads(pickle.dumps((plan, rows))))
        for i in range(6):
            engine.add_request(f"r{i}", None, [1, 2, 3, 4 + i],
                               so(json=FLAGS, disable_any_whitespace=True, temperature=1.0, seed=i, n=2, max_tokens=60))
        engine.add_request("phone", None, [1, 2, 3], so(regex=PHONE, temperature=1.0, seed=9, max_tokens=40))
        outs = run(engine)
        assert engine.stats().num_preemptions_total > 0
        for rid, out in outs.items():
            if rid == "phone":
                assert re.fullmatch(PHONE, out.outputs[0].text)
            else:
                assert_valid(out, FLAGS)
        return {rid: [(c.token_ids, c.text) for c in out.outputs] for rid, out in outs.items()}

    assert outputs(copied=True) == outputs(copied=False)


def test_ignore_eos_still_ends_at_the_grammar(engine):
    engine.add_request("r", None, [1, 2, 3], so(choice=["yes", "no"], temperature=0.0, ignore_eos=True))
    [out] = run(engine).values()
    assert out.outputs[0].text in ("yes", "no") and out.outputs[0].finish_reason == "stop"


def test_unconstrained_requests_beside_constrained_ones_are_unchanged():
    alone, mixed = mock_engine(), mock_engine()
    plain = SamplingParams(temperature=1.0, seed=11, max_tokens=20, ignore_eos=True)
    alone.add_request("plain", None, [1, 2, 3], plain)
    mixed.add_request("plain", None, [1, 2, 3], plain)
    mixed.add_request("json", None, [1, 2, 3],
                      so(json=FLAGS, disable_any_whitespace=True, temperature=1.0, seed=11))
    assert run(alone)["plain"].outputs[0].token_ids == run(mixed)["plain"].outputs[0].token_ids


def test_grammar_state_is_freed_when_a_sequence_finishes_or_is_aborted(engine):
    engine.add_request("done", None, [1, 2, 3], so(choice=["yes", "no"], temperature=0.0))
    engine.add_request("cut", None, [1, 2, 3], so(json=PERSON, temperature=0.0))
    engine.step()
    states = [weakref.ref(s.grammar) for r in engine.requests.values() for s in r.seqs]
    assert len(states) == 2 and all(ref() is not None for ref in states)
    engine.abort_request("cut")
    run(engine)
    gc.collect()
    assert all(ref() is None for ref in states)

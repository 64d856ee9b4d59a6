"""Unusable constraints are refused at the request check with a 400 that names the problem and the field."""

from __future__ import annotations

import pytest

from hetero_infer.contracts.sampling_params import SamplingParams, StructuredOutputsParams
from hetero_infer.worker.core.request_check import EngineLimits, RequestError, check_request

LIMITS = EngineLimits("m", 512, 1000, 100, 16, (2,))


def check(**kwargs) -> None:
    check_request([1, 2, 3], SamplingParams(**kwargs), LIMITS)


@pytest.mark.parametrize(("so", "words"), [
    (StructuredOutputsParams(json={"type": "strin"}), ["JSON schema", "strin"]),
    (StructuredOutputsParams(json='{"type": "object",'), ["not valid JSON"]),
    (StructuredOutputsParams(json=[1, 2]), ["must be an object"]),
    (StructuredOutputsParams(json={"type": "integer", "minimum": 5, "maximum": 1}), ["minimum"]),
    (StructuredOutputsParams(regex="a(b"), ["regex", "parenthesis"]),
    (StructuredOutputsParams(grammar='root ::= foo'), ["grammar", "foo"]),
    (StructuredOutputsParams(choice=[]), ["choice"]),
    (StructuredOutputsParams(choice=["a", 3]), ["choice"]),
    (StructuredOutputsParams(), ["exactly one", "none"]),
    (StructuredOutputsParams(regex="a", choice=["a"]), ["exactly one", "regex", "choice"]),
])
def test_bad_structured_outputs_get_a_400_naming_the_problem(so, words):
    with pytest.raises(RequestError) as info:
        check(structured_outputs=so)
    err = info.value
    assert err.status == 400 and err.param == "structured_outputs"
    assert all(w in err.message for w in words), err.message
    assert "/project/" not in err.message  # no C++ source locations


@pytest.mark.parametrize("so", [
    StructuredOutputsParams(json={"type": "object", "properties": {"a": {"type": "string"}}}),
    StructuredOutputsParams(json='{"type": "array", "items": {"enum": [1, 2]}}'),
    StructuredOutputsParams(regex=r"\d{3}-[a-z]+"),
    StructuredOutputsParams(choice=["yes", "no"]),
    StructuredOutputsParams(grammar='root ::= "a" | "b" root'),
    StructuredOutputsParams(json_object=True),
])
def test_good_structured_outputs_pass(so):
    check(structured_outputs=so)


@pytest.mark.parametrize(("bias", "words"), [
    ({1000: 1.0}, ["1000", "[0, 1000)"]),
    ({-1: 1.0}, ["-1"]),
    ({"5": 1.0}, ["'5'"]),
    ({5: 100.5}, ["[-100, 100]", "100.5"]),
    ({5: "high"}, ["'high'"]),
])
def test_bad_logit_bias_gets_a_400(bias, words):
    with pytest.raises(RequestError) as info:
        check(logit_bias=bias)
    assert info.value.param == "logit_bias" and info.value.status == 400
    assert all(w in info.value.message for w in words), info.value.message


def test_good_logit_bias_passes():
    check(logit_bias={0: -100, 999: 100.0, 5: 0.5})

"""A request's structured-output constraint: OpenAI's `response_format`, vLLM's `guided_*` fields, its
`structured_outputs` object, or a tool choice that fixes the output's shape, as the engine's one
`StructuredOutputsParams`. At most one may be given; two are a 400 that names both.

`prepare_grammar` has the engine compile the grammar off its stepping loop before the request is queued: the
request waits (at most --grammar-compile-timeout seconds, then a 400), no other stream does."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from hetero_infer.contracts.protocol import ChatCompletionRequest, CompletionRequest, StructuredOutputs
from hetero_infer.contracts.sampling_params import SamplingParams, StructuredOutputsParams
from hetero_infer.worker.frontend.client import EngineDeadError
from hetero_infer.worker.server.errors import APIError, as_api_error, bad_request
from hetero_infer.worker.server.tools.constraint import tool_constraint


def structured_outputs(req: CompletionRequest | ChatCompletionRequest) -> tuple[str, StructuredOutputsParams] | None:
    """The request's one constraint and the field it came from (None without any); 400 for two, or for a JSON
    schema that is no schema (the engine's check compiles it)."""
    found: list[tuple[str, StructuredOutputsParams]] = []
    fmt = req.response_format
    if fmt is not None and fmt.type == "json_object":
        found.append(("response_format", StructuredOutputsParams(json_object=True)))
    elif fmt is not None and fmt.type == "json_schema":
        assert fmt.json_schema is not None  # checked by the model
        found.append(("response_format", StructuredOutputsParams(json=_schema(fmt.json_schema.schema_,
                                                                              "response_format.json_schema.schema"))))
    if req.guided_json is not None:
        found.append(("guided_json", StructuredOutputsParams(json=_schema(req.guided_json, "guided_json"))))
    for name in ("regex", "choice", "grammar"):
        value = getattr(req, f"guided_{name}")
        if value is not None:
            found.append((f"guided_{name}", StructuredOutputsParams(**{name: value})))
    if req.structured_outputs is not None:
        sop = _from_object(req.structured_outputs)
        if sop is not None:
            found.append(("structured_outputs", sop))
    if isinstance(req, ChatCompletionRequest):
        schema = tool_constraint(req)
        if schema is not None:
            # compact JSON: arguments are read by programs, and whitespace is no token budget's best use
            found.append(("tool_choice", StructuredOutputsParams(json=schema, disable_any_whitespace=True)))
    if len(found) > 1:
        names = ", ".join(f"`{n}`" for n, _ in found)
        raise bad_request(f"only one structured-output constraint may be given per request; got {names}",
                          found[1][0])
    return found[0] if found else None


def _from_object(so: StructuredOutputs) -> StructuredOutputsParams | None:
    given = {k: v for k, v in (("json", so.json_), ("regex", so.regex), ("choice", so.choice),
                               ("grammar", so.grammar), ("json_object", so.json_object or None)) if v is not None}
    if len(given) > 1:
        raise bad_request("structured_outputs takes exactly one of json, regex, choice, grammar, json_object; got "
                          + ", ".join(sorted(given)), "structured_outputs")
    if not given:
        return None
    if "json" in given:
        given["json"] = _schema(given["json"], "structured_outputs.json")
    return StructuredOutputsParams(**given, disable_any_whitespace=so.disable_any_whitespace)


def _schema(value: Any, param: str) -> dict | bool:
    """A JSON schema given as an object, a boolean, or its JSON text, as an object or boolean."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise bad_request(f"{param} is not valid JSON: {exc}", param) from None
    if not isinstance(value, dict | bool):
        raise bad_request(f"{param} must be a JSON schema (an object or a boolean)", param)
    if isinstance(value, dict) and "type" in value and not isinstance(value["type"], str | list):
        raise bad_request(f"{param}: `type` must be a string or a list of strings", param)
    return value



async def prepare_grammar(state: Any, req: CompletionRequest | ChatCompletionRequest, params: SamplingParams) -> None:
    """Wait until the engine has compiled the request's grammar (`EngineClient.prepare_grammar`; at once when it
    is cached); a 400 naming the constraint's field if it does not compile within the server's bound."""
    if params.structured_outputs is None:
        return
    from hetero_infer.worker.structured import ConstraintError, spec_of

    timeout = state.options.grammar_compile_timeout
    try:
        await asyncio.wait_for(state.engine.prepare_grammar(spec_of(params.structured_outputs),
                                                            time.monotonic() + timeout), timeout)
    except TimeoutError:  # asyncio's, or the engine's CompileTimeout (it was still queued at the deadline)
        state.metrics.rejected("grammar_compile_timeout")
        raise APIError(400, f"the structured-output constraint did not compile within {timeout:g} s (this "
                       "server's --grammar-compile-timeout); simplify the schema (very large maxLength, "
                       "maxItems or repetition bounds are slow to compile)", param=_field(req),
                       code="grammar_compile_timeout") from None
    except ConstraintError as exc:
        raise bad_request(str(exc), _field(req)) from None
    except EngineDeadError as exc:  # it died meanwhile
        raise as_api_error(exc) from None


def _field(req: CompletionRequest | ChatCompletionRequest) -> str:
    found = structured_outputs(req)
    return found[0] if found else "structured_outputs"

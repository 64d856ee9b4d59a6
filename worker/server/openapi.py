"""`GET /openapi.json`: an OpenAPI 3.1 description of the worker, generated from the pydantic models."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from hetero_infer.contracts import protocol as p
from hetero_infer.worker.server import extras as x

_REF = "#/components/schemas/{model}"
_ERROR_STATUSES = {
    "400": "Invalid request (malformed JSON, wrong types, out-of-range values, prompt too long)",
    "401": "Missing or wrong API key (only when the server has keys)",
    "403": "A browser request from an origin not in --allowed-origins",
    "404": "Unknown model",
    "408": "The request body did not arrive within --body-timeout-s",
    "413": "Request body too large",
    "415": "The body's Content-Type is not JSON",
    "429": "Too many requests waiting; retry after `Retry-After` seconds",
    "500": "The engine failed while generating this request",
    "503": "Loading, shutting down, or the engine has failed",
    "504": "The request ran past the server's timeout",
}


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": _REF.format(model=model.__name__)}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*codes: str) -> dict[str, Any]:
    return {c: _json(_ref(p.ErrorResponse), _ERROR_STATUSES[c]) for c in codes}


def _generation(request: type[BaseModel], response: type[BaseModel], chunk: type[BaseModel], summary: str,
                auth: list[str]) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(request)}}},
            "responses": {
                "200": {
                    "description": "The completion, or with `stream: true` server-sent events: one "
                    f"`data: <{chunk.__name__}>` per update, then `data: [DONE]`",
                    "content": {
                        "application/json": {"schema": _ref(response)},
                        # OpenAPI 3.1: for an event stream, `schema` describes one event.
                        "text/event-stream": {"schema": {
                            "type": "object",
                            "required": ["data"],
                            "properties": {
                                "event": {"type": "string"},
                                "data": {
                                    "description": f"a JSON {chunk.__name__} (or an ErrorResponse); the last "
                                    "event is `[DONE]`",
                                    "oneOf": [
                                        {"type": "string", "const": "[DONE]"},
                                        {"type": "string", "contentMediaType": "application/json",
                                         "contentSchema": {"oneOf": [_ref(chunk), _ref(p.ErrorResponse)]}},
                                    ],
                                },
                            },
                        }},
                    },
                },
                **_errors(*auth, "400", "403", "404", "408", "413", "415", "429", "500", "503", "504"),
            },
        }
    }


def _vllm_extras(auth: list[str]) -> dict[str, Any]:
    """vLLM's /tokenize, /detokenize, /health and /version (worker/server/extras.py)."""
    def post(request: dict[str, Any], response: type[BaseModel], summary: str) -> dict[str, Any]:
        return {"post": {
            "summary": summary,
            "requestBody": {"required": True, "content": {"application/json": {"schema": request}}},
            "responses": {"200": _json(_ref(response), "OK"), **_errors(*auth, "400", "403", "404", "408", "413",
                                                                           "415", "503")},
        }}

    empty = {"description": "Engine alive (empty body)"}
    return {
        "/tokenize": post({"anyOf": [_ref(x.TokenizeCompletionRequest), _ref(x.TokenizeChatRequest)]},
                          x.TokenizeResponse, "Tokenize a prompt, or messages rendered with the chat template"),
        "/detokenize": post(_ref(x.DetokenizeRequest), x.DetokenizeResponse, "Token ids to text"),
        "/health": {"get": {"summary": "vLLM's health probe", "responses": {
            "200": empty, "503": {"description": "Loading, or the engine has failed (empty body)"}}}},
        "/version": {"get": {"summary": "Server version", "responses": {"200": _json(_ref(x.VersionResponse),
                                                                                     "Version")}}},
    }


def _lora_updates(auth: list[str]) -> dict[str, Any]:
    """vLLM's run-time adapter endpoints (worker/server/lora.py; only with --allow-runtime-lora-updating)."""
    def post(request: type[BaseModel], summary: str, *errors: str) -> dict[str, Any]:
        return {"post": {
            "summary": summary,
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(request)}}},
            "responses": {"200": {"description": "Success (a line of text)",
                                  "content": {"text/plain": {"schema": {"type": "string"}}}},
                          **_errors(*auth, "400", *errors, "503")},
        }}

    return {"/v1/load_lora_adapter": post(p.LoadLoRAAdapterRequest, "Load a LoRA adapter and serve it by name"),
            "/v1/unload_lora_adapter": post(p.UnloadLoRAAdapterRequest, "Stop serving a LoRA adapter", "404")}


def build_openapi(*, title: str = "hetero-infer worker", version: str = "0.1.0", auth: bool = False,
                  lora_updates: bool = False) -> dict[str, Any]:
    request_models: list[type[BaseModel]] = [p.CompletionRequest, p.ChatCompletionRequest,
                                             x.TokenizeCompletionRequest, x.TokenizeChatRequest, x.DetokenizeRequest,
                                             p.LoadLoRAAdapterRequest, p.UnloadLoRAAdapterRequest]
    response_models: list[type[BaseModel]] = [
        p.CompletionResponse, p.CompletionChunk, p.ChatCompletionResponse, p.ChatCompletionChunk,
        p.ModelList, p.ModelCard, p.ErrorResponse, p.HealthStatus,
        x.TokenizeResponse, x.DetokenizeResponse, x.VersionResponse,
    ]
    _, top = models_json_schema(
        [(m, "validation") for m in request_models + response_models],
        ref_template=_REF,
    )
    auth_codes = ["401"] if auth else []
    health = _json(_ref(p.HealthStatus), "OK")
    spec: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version,
                 "description": "OpenAI-compatible completions and chat completions with Prometheus metrics."},
        "paths": {
            "/healthz": {"get": {"summary": "Process alive (liveness)", "responses": {
                "200": health, "503": _json(_ref(p.HealthStatus), "The engine has failed (restart the process)")}}},
            "/readyz": {"get": {"summary": "Model loaded, engine healthy and not draining", "responses": {
                "200": health, "503": _json(_ref(p.HealthStatus), "Not ready (loading, draining, engine failed)")}}},
            "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {"200": {
                "description": "Prometheus text format", "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
            "/openapi.json": {"get": {"summary": "This document", "responses": {"200": _json({"type": "object"},
                                                                                             "OpenAPI 3.1")}}},
            "/v1/models": {"get": {"summary": "The served model and its LoRA adapters", "responses": {
                "200": _json(_ref(p.ModelList), "Models"), **_errors(*auth_codes, "503")}}},
            "/v1/models/{model}": {"get": {
                "summary": "One model",
                "parameters": [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {"200": _json(_ref(p.ModelCard), "The model"), **_errors(*auth_codes, "404", "503")},
            }},
            "/v1/completions": _generation(p.CompletionRequest, p.CompletionResponse, p.CompletionChunk,
                                           "Text completion", auth_codes),
            "/v1/chat/completions": _generation(p.ChatCompletionRequest, p.ChatCompletionResponse,
                                                p.ChatCompletionChunk, "Chat completion", auth_codes),
            **_vllm_extras(auth_codes),
            **(_lora_updates(auth_codes) if lora_updates else {}),
        },
        "components": {"schemas": top.get("$defs", {})},
    }
    if auth:
        spec["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        for path, ops in spec["paths"].items():
            if path.startswith(("/v1/", "/tokenize", "/detokenize")):
                for op in ops.values():
                    op["security"] = [{"bearer": []}]
    return spec

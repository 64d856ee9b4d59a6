"""/v1/completions: prompts (text, token ids, or batches of either), optional echo and logprobs."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from hetero_infer.contracts.protocol import CompletionRequest
from hetero_infer.worker.core.outputs import CompletionOutput, SampleDelta
from hetero_infer.worker.server.formatting import Choice, Formatter, dumps, json_reason, json_str
from hetero_infer.worker.server.generate import generate
from hetero_infer.worker.server.prompts import (
    Prompt,
    completion_prompts,
    parse_body,
    prompt_logprobs_of,
    request_sampling_params,
)
from hetero_infer.worker.server.state import get_state
from hetero_infer.worker.server.structured import prepare_grammar


async def create_completion(request: web.Request) -> web.StreamResponse:
    arrival = time.monotonic()
    state = get_state(request)
    req: CompletionRequest = await parse_body(request, CompletionRequest)
    lora_request = state.check_model(req.model)
    state.check_serving()
    prompts = await completion_prompts(state, req)
    params = [request_sampling_params(state, req, p, "prompt" if len(prompts) == 1 else f"prompt.{i}")
              for i, p in enumerate(prompts)]
    fmt = CompletionFormatter(state, req, prompts)
    return await generate(request, state, prompts, params, fmt, arrival, req.stream,
                          bool(req.stream_options and req.stream_options.include_usage),
                          lambda: prepare_grammar(state, req, params[0]),  # one constraint for all the prompts
                          lora_request)


class CompletionFormatter(Formatter):
    object_name = "text_completion"
    chunk_object = "text_completion"
    id_prefix = "cmpl-"

    def __init__(self, state: Any, req: CompletionRequest, prompts: list[Prompt]) -> None:
        super().__init__(state, req.n, prompts, req.model)
        self.top_n = req.logprobs
        self.echo = req.echo
        self.prompt_top = prompt_logprobs_of(req)
        self.echo_only = req.echo_only
        # A worker without a tokenizer (--skip-tokenizer-init) answers in token ids, with empty text, as vLLM does
        # (no logprobs or echo then: refused before generation).
        self.token_ids_only = state.tokenizer is None
        self._echo_text: dict[int, str] = {}
        self._echo_logprobs_of: dict[int, dict[str, list]] = {}  # per prompt: its part of echoed choices' logprobs

    def shown(self, d: SampleDelta) -> SampleDelta:
        if not self.echo_only:
            return d
        return SampleDelta([], "", None if d.logprobs is None else [], d.cumulative_logprob, d.finish_reason,
                           d.stop_reason)

    def shown_output(self, c: CompletionOutput) -> CompletionOutput:
        if not self.echo_only:
            return c
        return CompletionOutput(c.index, "", [], c.cumulative_logprob, None if c.logprobs is None else [],
                                c.finish_reason, c.stop_reason)

    def _prompt_text(self, idx: int) -> str:
        p_idx = idx // self.n
        if p_idx not in self._echo_text:
            p = self.prompts[p_idx]
            self._echo_text[p_idx] = p.text if p.text is not None else self.state.tokenizer.decode(p.token_ids)
        return self._echo_text[p_idx]

    def _logprobs(self, token_ids: list[int], entries: list[dict[int, float]] | None, ch: Choice) -> dict[str, Any]:
        """`text_offset` counts characters of the choice's text, from the tokens' own bytes (a character split
        over tokens starts at the first of them)."""
        tokens, token_lps, tops, offsets = [], [], [], []
        for text, raw, lp, top in self._token_logprobs(token_ids, entries, self.top_n or 0):
            tokens.append(text)
            token_lps.append(lp)
            tops.append({t: v for t, _, v in top})
            offsets.append(ch.advance(raw))
        return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}

    def _echo_logprobs(self, idx: int) -> dict[str, Any]:
        """The prompt's part of an echoed choice's logprobs (the request's prompt logprobs): its first token has
        none (null), as OpenAI's; offsets count from the start of the prompt's text. Made once per prompt (its n
        choices share it)."""
        p_idx = idx // self.n
        if p_idx in self._echo_logprobs_of:
            return self._echo_logprobs_of[p_idx]
        ids = self.prompts[p_idx].token_ids
        entries = self.prompt_logprobs[p_idx]
        ch = Choice()
        out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        first = self._token_logprobs(ids[:1], [{}], 0)
        rest = self._token_logprobs(ids[1:], entries[1:], self.top_n or 0)
        for i, (text, raw, lp, top) in enumerate(first + rest):
            out["tokens"].append(text)
            out["token_logprobs"].append(lp if i else None)
            out["top_logprobs"].append({t: v for t, _, v in top} if i else None)
            out["text_offset"].append(ch.advance(raw))
        self._echo_logprobs_of[p_idx] = out
        return out

    def _choice_logprobs(self, idx: int, token_ids: list[int], entries: list[dict[int, float]] | None,
                         ch: Choice) -> dict[str, Any]:
        """A choice's logprobs: its generated tokens', after the prompt's when the request echoes it."""
        generated = self._logprobs(token_ids, entries, ch)
        if not self.echo:
            return generated
        prompt = self._echo_logprobs(idx)
        return {key: prompt[key] + generated[key] for key in prompt}  # new lists: the shared part stays as it is

    def _chunk(self, idx: int, d: SampleDelta, ch: Choice) -> str:
        text = d.text
        if self.token_ids_only:
            return self._base_chunk(dumps({"index": idx, "text": text, "logprobs": None, "token_ids": d.token_ids,
                                           "finish_reason": d.finish_reason}))
        if self.echo and not ch.started:
            text = self._prompt_text(idx) + text
        if self.top_n is None:  # the common case, without a dict round trip
            return self._base_chunk(f'{{"index":{idx},"text":{json_str(text)},"logprobs":null,'
                                    f'"finish_reason":{json_reason(d.finish_reason)}}}')
        if not ch.started and self.echo:
            ch.offset = len(self._prompt_text(idx))
            logprobs = self._choice_logprobs(idx, d.token_ids, d.logprobs, ch)
        else:
            logprobs = self._logprobs(d.token_ids, d.logprobs, ch)
        return self._base_chunk(dumps({"index": idx, "text": text, "logprobs": logprobs,
                                       "finish_reason": d.finish_reason}))

    def _choice(self, idx: int, c: CompletionOutput) -> dict[str, Any]:
        prefix = self._prompt_text(idx) if self.echo else ""
        logprobs = None
        if self.top_n is not None:
            ch = Choice()
            ch.offset = len(prefix)
            logprobs = self._choice_logprobs(idx, c.token_ids, c.logprobs, ch)
        choice = {"index": idx, "text": prefix + c.text, "logprobs": logprobs, "finish_reason": c.finish_reason}
        if self.token_ids_only:
            choice["token_ids"] = list(c.token_ids)
        if self.prompt_top is not None:
            choice["prompt_logprobs"] = self.vllm_prompt_logprobs(idx // self.n)
        return choice

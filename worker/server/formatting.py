"""What both endpoints share to answer: the per-choice state of a response and the constant parts of its
chunks. A formatter turns each engine delta into stream chunks once (`chunks`), or the requests' cumulative
outputs into one response (`response`); the endpoint's subclass shapes a chunk and a choice."""

from __future__ import annotations

import codecs
import json
import math
import time
from abc import ABC, abstractmethod
from typing import Any

from hetero_infer.worker.core.outputs import CompletionOutput, RequestDelta, RequestOutput, SampleDelta
from hetero_infer.worker.server.ids import new_id
from hetero_infer.worker.server.prompts import Prompt
from hetero_infer.worker.server.token_bytes import token_bytes_for

# (token text, its own bytes, logprob, top-N (text, bytes, logprob))
TokenLogprob = tuple[str, bytes, float, list[tuple[str, bytes, float]]]

dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
json_str = json.encoder.encode_basestring  # a JSON string literal (C implementation)


def json_reason(finish_reason: str | None) -> str:
    return "null" if finish_reason is None else json_str(finish_reason)


def finite(logprob: float | None) -> float:
    """Logprobs as JSON-safe numbers: a missing or -inf logprob becomes -9999.0, as OpenAI reports it."""
    if logprob is None or math.isnan(logprob) or logprob < -9999.0:
        return -9999.0
    return float(logprob)


class Choice:
    """What a stream has sent of one choice."""

    __slots__ = ("tokens", "offset", "utf8", "done", "started", "extra")

    def __init__(self) -> None:
        self.tokens = 0  # tokens already sent
        self.offset = 0  # completions logprobs: text offset of the next token
        self.utf8 = codecs.getincrementaldecoder("utf-8")("replace")  # the tokens' bytes so far, as characters
        self.done = False
        self.started = False
        self.extra: Any = None  # what an endpoint keeps per streamed choice (chat: its tool-call state)

    def advance(self, token_bytes: bytes) -> int:
        """Text offset of a token, then move past it: a token that ends inside a character adds none yet."""
        offset = self.offset
        self.offset += len(self.utf8.decode(token_bytes))
        return offset


class Formatter(ABC):
    object_name = ""
    chunk_object = ""
    id_prefix = ""

    def __init__(self, state: Any, n: int, prompts: list[Prompt], model: str | None = None) -> None:
        """`model`: the served name the request asked for (checked: the base model's or a LoRA adapter's)."""
        self.state = state
        self.model = model or state.model_name
        self.n = n
        self.prompts = prompts
        self.id = f"{self.id_prefix}{new_id()}"
        self.created = int(time.time())
        self.prompt_index: dict[str, int] = {}
        self.choices = [Choice() for _ in range(len(prompts) * n)]
        self.completion_tokens = [0] * len(self.choices)
        self.cached_tokens: dict[str, int] = {}  # per engine request: prompt tokens the prefix cache served
        self.prompt_logprobs: dict[int, list] = {}  # per prompt (its index), when the request asked for them
        self.prompt_logprob_ranks: dict[int, list] = {}  # beside them: the prompt tokens' ranks
        # the request's prompt logprobs' top N (`prompts.prompt_logprobs_of`), where it has them
        self.prompt_top: int | None = None
        self._vllm_prompt_logprobs: dict[int, list] = {}
        options = getattr(state, "options", None)
        self.prompt_tokens_details = options is None or options.enable_prompt_tokens_details
        self._chunk_head = (f'{{"id":{json_str(self.id)},"object":{json_str(self.chunk_object)},'
                            f'"created":{self.created},"model":{json_str(self.model)},"choices":[')
        self.set_include_usage(False)

    def bind(self, request_ids: list[str]) -> None:
        self.prompt_index = {rid: i for i, rid in enumerate(request_ids)}

    def usage(self) -> dict[str, Any]:
        prompt = sum(len(p.token_ids) for p in self.prompts)
        completion = sum(self.completion_tokens)
        usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion,
                                 "total_tokens": prompt + completion}
        if self.prompt_tokens_details:
            usage["prompt_tokens_details"] = {"cached_tokens": sum(self.cached_tokens.values())}
        return usage

    def set_include_usage(self, include_usage: bool) -> None:
        """Streaming: with usage, every chunk carries `"usage": null` and a last chunk the totals."""
        self.include_usage = include_usage
        self._chunk_tail = '],"usage":null}' if include_usage else "]}"

    def usage_chunk(self) -> dict[str, Any]:
        return {"id": self.id, "object": self.chunk_object, "created": self.created, "model": self.model,
                "choices": [], "usage": self.usage()}

    def note(self, delta: RequestDelta) -> None:
        """Record what a request's first delta carries: its cached prompt tokens (as first admitted, as the
        metrics do: streamed or not, usage says the same) and its prompt logprobs."""
        self.cached_tokens.setdefault(delta.request_id, delta.num_cached_tokens)
        if delta.prompt_logprobs is not None:
            p_idx = self.prompt_index[delta.request_id]
            self.prompt_logprobs[p_idx] = delta.prompt_logprobs
            self.prompt_logprob_ranks[p_idx] = delta.prompt_logprob_ranks

    def chunks(self, deltas: list[RequestDelta]) -> list[str]:
        """Stream chunks (JSON text) for what is new in `deltas` (one chunk per choice that changed)."""
        chunks = []
        note = self.note
        for delta in deltas:
            note(delta)
            base = self.prompt_index[delta.request_id] * self.n
            for i, d in enumerate(delta.samples):
                idx = base + i
                ch = self.choices[idx]
                if ch.done:
                    continue
                d = self.shown(d)
                new_tokens = len(d.token_ids)
                if not d.text and not new_tokens and d.finish_reason is None and ch.started:
                    continue
                chunks.append(self._chunk(idx, d, ch))
                ch.tokens += new_tokens
                ch.started = True
                self.completion_tokens[idx] = ch.tokens
                if d.finish_reason is not None:
                    ch.done = True
        return chunks

    def response(self, outputs: list[RequestOutput]) -> dict[str, Any]:
        """The whole (non-streamed) response from the requests' cumulative outputs (their deltas went through
        `note`)."""
        found = [(self.prompt_index[out.request_id] * self.n + c.index, c) for out in outputs for c in out.outputs]
        choices = []
        for idx, c in sorted(found, key=lambda x: x[0]):
            c = self.shown_output(c)
            self.completion_tokens[idx] = len(c.token_ids)
            choices.append(self._choice(idx, c))
        return {"id": self.id, "object": self.object_name, "created": self.created, "model": self.model,
                "choices": choices, "usage": self.usage()}

    def vllm_prompt_logprobs(self, p_idx: int) -> list[dict[str, dict[str, Any]] | None]:
        """vLLM's `prompt_logprobs` of prompt `p_idx`: per token, None for the first, else {token id: {logprob,
        rank, decoded_token}} of the `prompt_top` most likely tokens at its position (ranks 1..N) and of the
        prompt token itself (its own rank), each decoded alone, special tokens included (as vLLM decodes them).
        Made once per prompt (its n choices share it)."""
        made = self._vllm_prompt_logprobs.get(p_idx)
        if made is not None:
            return made
        text_of = self.state.decoded_token
        out: list[dict[str, dict[str, Any]] | None] = [None]
        ids, ranks, k = self.prompts[p_idx].token_ids, self.prompt_logprob_ranks[p_idx], self.prompt_top or 0
        for pos, entry in enumerate(self.prompt_logprobs[p_idx][1:], start=1):
            top = sorted(entry.items(), key=lambda kv: kv[1], reverse=True)[:k] if k else []
            d = {str(t): {"logprob": finite(lp), "rank": r, "decoded_token": text_of(t)}
                 for r, (t, lp) in enumerate(top, start=1)}
            tid = ids[pos]
            d[str(tid)] = {"logprob": finite(entry[tid]), "rank": ranks[pos], "decoded_token": text_of(tid)}
            out.append(d)
        self._vllm_prompt_logprobs[p_idx] = out
        return out

    def shown(self, d: SampleDelta) -> SampleDelta:
        """What a response shows of a sample's delta: all of it, but where the request asked for none of its
        generated tokens (echo alone)."""
        return d

    def shown_output(self, c: CompletionOutput) -> CompletionOutput:
        """What a response shows of a sample's whole output (as `shown`)."""
        return c

    def _base_chunk(self, choice: str) -> str:
        """A whole chunk around one choice's JSON (the constant parts are encoded once per request)."""
        return self._chunk_head + choice + self._chunk_tail

    def _token_logprobs(self, token_ids: list[int], entries: list[dict[int, float]] | None,
                        top_n: int) -> list[TokenLogprob]:
        """(token text, its bytes, logprob, top-N (text, bytes, logprob)) for the given tokens and their logprobs
        entries. The text is the token decoded alone (U+FFFD for part of a character); the bytes are its own."""
        text_of = self.state.token_text
        bytes_of = token_bytes_for(self.state.tokenizer)
        result = []
        for tid, d in zip(token_ids, entries or ()):
            top = sorted(d.items(), key=lambda kv: kv[1], reverse=True)[:top_n] if top_n else []
            text = text_of(tid)
            result.append((text, bytes_of(tid, text), finite(d.get(tid)),
                           [(t_text, bytes_of(t, t_text), finite(lp)) for t, lp in top for t_text in (text_of(t),)]))
        return result

    @abstractmethod
    def _chunk(self, idx: int, d: SampleDelta, ch: Choice) -> str:
        """The stream chunk for what one choice gained (`ch`: what was sent of it before)."""

    @abstractmethod
    def _choice(self, idx: int, c: CompletionOutput) -> dict[str, Any]:
        """The final (non-streamed) choice."""

"""Incremental detokenization with stop strings, for one output sequence (`IncrementalDetokenizer`), and the
output text of a frontend's requests, filled into the engine's token-only deltas (`DeltaDetokenizer`).

Uses vLLM's prefix/read offsets: each new token is decoded together with the few tokens
before it (so merges, leading spaces and multi-byte characters come out right) and only
the text past the previous window is appended, which is O(1) amortized per token.
"""

from __future__ import annotations

from typing import Any

from hetero_infer.contracts.sampling_params import SamplingParams
from hetero_infer.contracts.tokenizer import Tokenizer
from hetero_infer.worker.core.outputs import RequestDelta, SampleDelta

# Prompt tokens decoded ahead of the first output token (same as vLLM).
_PROMPT_CONTEXT = 5
_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: list[int], params: SamplingParams) -> None:
        self._hf = tokenizer.hf
        self._skip = tokenizer.special_token_ids if params.skip_special_tokens else frozenset()
        self._stops = list(params.stop_strings)
        self._hold = max((len(s) for s in self._stops), default=1) - 1
        self._include_stop = params.include_stop_str_in_output
        self._min_tokens = params.min_tokens
        self._num_tokens = 0
        self._tokens = self._to_tokens(prompt_token_ids[-(_PROMPT_CONTEXT + 2) :])
        self._prefix_offset = max(len(self._tokens) - _PROMPT_CONTEXT, 0)
        self._read_offset = len(self._tokens)
        self._text = ""  # committed output text (complete characters only)
        self._stop: str | None = None

    @property
    def stop_string(self) -> str | None:
        """The stop string that ended the sequence, if any."""
        return self._stop

    def add_token(self, token_id: int) -> str | None:
        """Append a token; return the stop string if the text now contains one."""
        if self._stop is not None:
            return None  # already stopped: later tokens are not part of the output
        self._num_tokens += 1
        new_tokens = self._to_tokens([token_id])
        if not new_tokens:
            return None
        self._tokens.extend(new_tokens)
        delta = self._pending_text()
        if not delta or delta.endswith(_REPLACEMENT):
            return None  # wait for the rest of a multi-byte character
        self._prefix_offset, self._read_offset = self._read_offset, len(self._tokens)
        # Only the current window is ever decoded again.
        del self._tokens[: self._prefix_offset]
        self._read_offset -= self._prefix_offset
        self._prefix_offset = 0
        old_len = len(self._text)
        self._text += delta
        # Like vLLM, stop strings only count once more than min_tokens tokens exist.
        if self._num_tokens <= self._min_tokens:
            return None
        return self._check_stop(old_len)

    @property
    def text(self) -> str:
        """All output text so far (a trailing incomplete character shows as U+FFFD), stop string cut."""
        if self._stop is not None:
            return self._text
        return self._text + self._pending_text()

    @property
    def final_text(self) -> str:
        """The output text of a finished sequence: `text` without a trailing incomplete character (a cut inside
        a multi-byte character; its bytes decode to one U+FFFD), as an incremental UTF-8 decoder leaves it."""
        text = self.text
        return text[:-1] if self._stop is None and text.endswith(_REPLACEMENT) else text

    def emittable_text(self, finished: bool) -> str:
        """Text safe to stream: always a prefix of every later `text`.

        While running, holds back a trailing incomplete character and the last
        (longest stop string - 1) characters, which could still turn into a stop string.
        Once finished everything is final and `final_text` is returned.
        """
        if finished or self._stop is not None:
            return self.final_text
        return self._text[: max(len(self._text) - self._hold, 0)]

    def _to_tokens(self, ids: list[int]) -> list[str]:
        tokens = []
        for i in ids:
            if i in self._skip:
                continue
            tok = self._hf.convert_ids_to_tokens(i)
            if tok is not None:  # None: id outside the vocabulary
                tokens.append(tok)
        return tokens

    def _pending_text(self) -> str:
        """Decoded text of the tokens after the read offset."""
        if self._read_offset == len(self._tokens):
            return ""
        window = self._tokens[self._prefix_offset :]
        prefix = self._hf.convert_tokens_to_string(window[: self._read_offset - self._prefix_offset])
        full = self._hf.convert_tokens_to_string(window)
        return full[len(prefix) :]

    def _check_stop(self, old_len: int) -> str | None:
        """Find the earliest stop string that overlaps the text appended after old_len."""
        best: tuple[int, str] | None = None
        for stop in self._stops:
            pos = self._text.find(stop, max(old_len - len(stop) + 1, 0))
            if pos != -1 and (best is None or pos < best[0]):
                best = (pos, stop)
        if best is None:
            return None
        pos, stop = best
        self._text = self._text[: pos + len(stop) if self._include_stop else pos]
        self._stop = stop
        return stop


class DeltaDetokenizer:
    """The text of requests whose deltas carry token ids only (the engine no longer detokenizes): the frontend
    registers each request (`add`) and passes every delta through `fill`, in order, which sets each sample's
    new text exactly as the engine used to (emittable text only; a stop string cuts it; the stop token's text
    only with include_stop_str_in_output). Without a tokenizer (token ids only) it leaves the text empty."""

    def __init__(self, tokenizer: Tokenizer | None) -> None:
        self.tokenizer = tokenizer
        self._eos = frozenset(tokenizer.eos_token_ids) if tokenizer is not None else frozenset()
        # request id -> (prompt token ids, params, per sample [detokenizer, characters already sent])
        self._requests: dict[str, tuple[list[int], SamplingParams, list[list[Any]]]] = {}

    def add(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        if self.tokenizer is not None:
            self._requests[request_id] = (prompt_token_ids, params, [])

    def drop(self, request_id: str) -> None:
        self._requests.pop(request_id, None)

    def fill(self, delta: RequestDelta) -> None:
        state = self._requests.get(delta.request_id)
        if state is None:
            return
        prompt, params, samples = state
        for i, d in enumerate(delta.samples):
            if i == len(samples):
                samples.append([IncrementalDetokenizer(self.tokenizer, prompt, params), 0])
            detok, sent = samples[i]
            ids = d.token_ids
            finished = d.finish_reason is not None
            if finished and ids and self._hides_last_token(d, ids[-1], params):
                ids = ids[:-1]
            for token_id in ids:
                detok.add_token(token_id)
            text = detok.emittable_text(finished)
            d.text = text[sent:]
            samples[i][1] = len(text)
        if delta.finished or delta.error is not None:
            del self._requests[delta.request_id]

    def _hides_last_token(self, d: SampleDelta, token_id: int, params: SamplingParams) -> bool:
        """Whether a finished sample's last token has no text: a stop token (EOS, stop_token_ids) unless
        include_stop_str_in_output, or the token its grammar refused (finish_reason "abort"), as the engine
        decides them (LLMEngine._accept)."""
        if d.finish_reason == "abort":
            return True
        if d.finish_reason != "stop" or params.include_stop_str_in_output:
            return False
        if isinstance(d.stop_reason, int):
            return True
        return d.stop_reason is None and not params.ignore_eos and token_id in self._eos

"""`LLM`: offline batched generation in the shape Python users know from vLLM."""

from __future__ import annotations

import itertools
from collections.abc import Sequence as Seq
from typing import Any

from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.log_config import configure_default_logging
from hetero_infer.worker.core.engine import LLMEngine
from hetero_infer.worker.core.outputs import RequestOutput
from hetero_infer.worker.core.sampling_params import SamplingParams


class LLM:
    """Load a model once and generate for many prompts with continuous batching.

    Keyword arguments are the engine options (see `EngineConfig`): device, dtype, block_size,
    max_num_blocks, max_num_seqs, max_model_len, max_num_batched_tokens, memory_threshold,
    executor ("torch" | "mock"), load_format ("auto" | "safetensors" | "gguf" | "dummy": random weights from
    config.json alone), skip_tokenizer_init (token ids in and out, no tokenizer files needed), ...
    """

    def __init__(self, model: str | None = None, **kwargs: Any) -> None:
        configure_default_logging()  # each start-up phase and its time on stderr, unless the program logs already
        self.engine = LLMEngine(EngineConfig.from_dict({"model": model, **kwargs}), offline=True)
        self._ids = itertools.count()

    def get_tokenizer(self):
        return self.engine.tokenizer

    def generate(
        self,
        prompts: str | Seq[str] | None = None,
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        prompt_token_ids: Seq[int] | Seq[Seq[int]] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """One RequestOutput per prompt, in input order. Bad input raises ValueError before any work."""
        if prompts is None and prompt_token_ids is None:
            raise ValueError("give prompts or prompt_token_ids")
        texts: list[str | None]
        if prompt_token_ids is not None:
            ids = list(prompt_token_ids)
            token_lists = [list(ids)] if ids and isinstance(ids[0], int) else [list(x) for x in ids]
            texts = [None] * len(token_lists)
            if prompts is not None:
                texts = [prompts] if isinstance(prompts, str) else list(prompts)
                if len(texts) != len(token_lists):
                    raise ValueError("prompts and prompt_token_ids differ in length")
        else:
            texts = [prompts] if isinstance(prompts, str) else list(prompts)
            token_lists = [self._tokenizer("text prompts").encode(t) for t in texts]
        return self._run(texts, token_lists, sampling_params, use_tqdm)

    def chat(
        self,
        messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Apply the model's chat template to one conversation (or a list of them) and generate."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        tok = self._tokenizer("chat")
        token_lists = [tok.apply_chat_template(c, add_generation_prompt=True) for c in conversations]
        return self._run([None] * len(token_lists), token_lists, sampling_params, use_tqdm)

    def _tokenizer(self, what: str):
        if self.engine.tokenizer is None:
            raise ValueError(f"a tokenizer is needed for {what}, and this LLM has none (skip_tokenizer_init=True): pass "
                             "prompt_token_ids")
        return self.engine.tokenizer

    def _run(self, texts, token_lists, sampling_params, use_tqdm) -> list[RequestOutput]:
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = (
            [sampling_params] * len(token_lists)
            if isinstance(sampling_params, SamplingParams)
            else list(sampling_params)
        )
        if len(params) != len(token_lists):
            raise ValueError(f"{len(params)} sampling params for {len(token_lists)} prompts")
        max_tokens = [self.engine.check_request(ids, p) for ids, p in zip(token_lists, params)]  # all or nothing
        order: dict[str, int] = {}
        for i, (text, ids, p, m) in enumerate(zip(texts, token_lists, params, max_tokens)):
            request_id = f"llm-{next(self._ids)}"
            order[request_id] = i
            self.engine.add_request(request_id, text, ids, p, max_tokens=m)
        results: list[RequestOutput | None] = [None] * len(token_lists)
        bar = None
        if use_tqdm:
            from tqdm import tqdm

            bar = tqdm(total=len(token_lists), desc="Generating", unit="req")
        try:
            while any(r is None for r in results):
                for out in self.engine.step():
                    if out.error is not None:
                        raise RuntimeError(f"generation failed: {out.error}")
                    if out.finished and out.request_id in order:
                        results[order[out.request_id]] = out
                        if bar:
                            bar.update()
        finally:
            for request_id, i in order.items():
                if results[i] is None:
                    self.engine.abort_request(request_id)
            if bar:
                bar.close()
        return results  # type: ignore[return-value]

"""Prompt logprobs (vLLM's `SamplingParams.prompt_logprobs`, OpenAI's `echo` with `logprobs`): for every prompt
token after the first, its logprob given the tokens before it, with the `k` most likely tokens at that position.

What evaluation harnesses score with (lm-evaluation-harness's loglikelihood tasks send `echo=True, logprobs=1`).
The prompt is run once more for them, on its own: in chunks of at most the step's token budget over a KV cache of
its own (the engine's cache and its prefix cache are untouched), the logits of at most `LOGITS_ROWS` rows at a
time, so that neither activations nor [rows, vocabulary] logits grow with the prompt.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from hetero_infer.worker.runner.attention.base import SeqSpan, StepBatch

LOGITS_ROWS = 256  # rows of [rows, vocab] float32 logits at a time: 150 MiB at a 151,936-token vocabulary
PromptLogprobs = list[dict[int, float] | None]  # position 0 has no logprob (None), as vLLM reports it


def entries(logits: torch.Tensor, targets: Sequence[int], k: int) -> list[dict[int, float]]:
    """Per row of `logits` [R, vocab] (float32 or wider): {its target: logprob} plus the `k` most likely tokens'."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    target = torch.as_tensor(list(targets), dtype=torch.long, device=logprobs.device)
    chosen = logprobs.gather(1, target[:, None])[:, 0].tolist()
    if k > 0:
        top_values, top_ids = logprobs.topk(k, dim=-1)
        top_values, top_ids = top_values.tolist(), top_ids.tolist()
    out = []
    for row, (t, lp) in enumerate(zip(targets, chosen, strict=True)):
        entry = dict(zip(top_ids[row], top_values[row], strict=True)) if k > 0 else {}
        entry[t] = lp
        out.append(entry)
    return out


def from_logit_rows(token_ids: Sequence[int], k: int, logit_rows: Callable[[int, int], torch.Tensor]) -> PromptLogprobs:
    """Prompt logprobs from `logit_rows(start, end)`: the next-token logits after positions start..end-1."""
    out: PromptLogprobs = [None]
    n = len(token_ids)
    for start in range(0, n - 1, LOGITS_ROWS):
        end = min(start + LOGITS_ROWS, n - 1)
        out += entries(logit_rows(start, end), token_ids[start + 1 : end + 1], k)
    return out


@torch.inference_mode()
def run_prompt(model, backend, staging, new_kv_cache: Callable[[int], list], token_ids: Sequence[int],
               block_size: int, chunk_tokens: int, k: int) -> PromptLogprobs:
    """The model's prompt logprobs of `token_ids`: the prompt run in chunks of `chunk_tokens` over a KV cache of
    its own (`new_kv_cache(num_blocks)`, the per-layer caches), each chunk's logits taken `LOGITS_ROWS` at a time."""
    n = len(token_ids)
    num_blocks = -(-n // block_size)
    caches = new_kv_cache(num_blocks)
    table = list(range(num_blocks))  # the prompt's blocks in order: a token's slot is its position
    out: PromptLogprobs = [None]
    for start in range(0, n, chunk_tokens):
        end = min(start + chunk_tokens, n)
        positions = np.arange(start, end, dtype=np.int64)
        batch = StepBatch([SeqSpan(table, start, end - start, True)], positions, positions, block_size)
        ids = list(token_ids[start:end])
        input_ids, staged = staging.pack(lambda pack, ids=ids, batch=batch: (pack.put(ids), backend.stage(batch, pack)))
        hidden = model(input_ids, backend, backend.metadata(staged), caches)
        rows = min(end, n - 1) - start  # the last prompt token predicts a generated one: not a prompt logprob
        for r in range(0, rows, LOGITS_ROWS):
            r_end = min(r + LOGITS_ROWS, rows)
            logits = model.compute_logits(hidden[r:r_end])
            out += entries(logits, token_ids[start + r + 1 : start + r_end + 1], k)
    return out

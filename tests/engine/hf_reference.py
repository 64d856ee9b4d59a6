"""An independent reference for what the engine samples: the documented recipe applied to transformers' logits.

The recipe (worker/runner/sampler.py's docstring, vLLM's order): repetition penalty over prompt + output (HF style:
positive logits divided, negative multiplied), then frequency and presence penalties over the output
(OpenAI style), then while fewer than `min_tokens` were produced the stop tokens (and EOS unless `ignore_eos`)
are masked, then temperature (greedy below 1e-5), top-k, top-p (the smallest set of most likely tokens, among
the top-k, whose mass reaches `top_p` of the top-k's mass), min-p (tokens below `min_p` x the most likely
token's probability are dropped); the token is the winner of the exponential race: argmax of probability /
noise, one Exp(1) draw per vocabulary entry and step, from the request's own `torch.Generator` when it has a
seed. Sample i > 0 of a seeded request seeds its generator with a splitmix64 mix of (seed, i).

Written here from that description in float64 with a full sort, without calling the engine's sampler.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hetero_infer import SamplingParams

_MASK64 = (1 << 64) - 1
GREEDY_BELOW = 1e-5


def sample_seed(seed: int, index: int) -> int:
    """The generator seed of sample `index` of a request seeded with `seed` (splitmix64 of seed + golden * (i+1))."""
    value = seed & _MASK64
    if index == 0:
        return value
    z = (value + 0x9E3779B97F4A7C15 * (index + 1)) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def noise_stream(seed: int, index: int, vocab: int):
    """The Exp(1) vectors, one per step, that sample `index` of a request seeded with `seed` races with."""
    gen = torch.Generator()
    gen.manual_seed(sample_seed(seed, index))
    while True:
        yield torch.empty(vocab).exponential_(generator=gen).double()


def teacher_forced_logits(model, prompt: list[int], output: list[int]) -> torch.Tensor:
    """transformers' float logits for each output position given the prompt and the earlier output tokens:
    row t is the distribution the engine's token t was drawn from (one forward pass, no KV-cache)."""
    ids = torch.tensor([prompt + output[:-1]], device=model.device)
    with torch.inference_mode():
        logits = model(ids).logits[0, len(prompt) - 1:]
    return logits.float().cpu()


def processed_logits(logits: torch.Tensor, params: SamplingParams, prompt: list[int], output: list[int],
                     eos_token_ids: list[int]) -> torch.Tensor:
    """Penalties and min_tokens masking of one step's raw logits (`output`: the tokens produced before it)."""
    x = logits.double().clone()
    if params.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(prompt) | set(output)), dtype=torch.long)
        v = x[seen]
        x[seen] = torch.where(v > 0, v / params.repetition_penalty, v * params.repetition_penalty)
    for token in set(output):
        x[token] -= params.frequency_penalty * output.count(token) + params.presence_penalty
    if len(output) < params.min_tokens:
        banned = set(params.stop_token_ids or []) | (set() if params.ignore_eos else set(eos_token_ids))
        x[sorted(banned)] = float("-inf")
    return x


def kept_distribution(x: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, top-k, top-p and min-p: the distribution a random row is drawn from (zero outside its support)."""
    probs = torch.softmax(x / params.temperature, dim=-1)
    vocab = len(probs)
    if 0 < params.top_k < vocab:
        sorted_p, order = probs.topk(params.top_k)  # the rest is out
    elif params.top_p < 1.0:
        sorted_p, order = probs.sort(descending=True, stable=True)
    else:
        sorted_p, order = probs, None  # no ranking needed
    keep = torch.ones_like(sorted_p, dtype=torch.bool)
    if params.top_p < 1.0:
        before = torch.cumsum(sorted_p, dim=0) - sorted_p  # mass of the more likely tokens (among the top-k)
        keep &= before < params.top_p * sorted_p.sum()
    if params.min_p > 0.0:
        keep &= sorted_p >= params.min_p * probs.max()
    out = torch.zeros_like(probs)
    if order is None:
        out[keep] = sorted_p[keep]
    else:
        out[order[keep]] = sorted_p[keep]
    return out / out.sum()


@dataclass
class StepCheck:
    step: int
    token: int  # what the engine produced
    expected: int  # what the recipe on transformers' logits produces with the same noise (or greedy)
    probability: float  # the engine token's probability under the reference distribution
    near_tie: bool  # the reference's runner-up is within `rel_tol` of its winner: float noise may pick either


def check_sample(logits: torch.Tensor, prompt: list[int], output: list[int], params: SamplingParams,
                 eos_token_ids: list[int], *, sample_index: int = 0, rel_tol: float = 1e-3) -> list[StepCheck]:
    """Replay one engine sample step by step against the reference (`logits`: `teacher_forced_logits` of the
    sample); a seeded or greedy sample has an expected token per step, an unseeded one only its probability
    (expected is then -1)."""
    greedy = params.temperature < GREEDY_BELOW
    noise = noise_stream(params.seed, sample_index, logits.shape[1]) if params.seed is not None and not greedy \
        else None
    checks = []
    for t, token in enumerate(output):
        x = processed_logits(logits[t], params, prompt, output[:t], eos_token_ids)
        if greedy:
            scores = x
            probability = 1.0 if token == int(x.argmax()) else 0.0
        else:
            dist = kept_distribution(x, params)
            probability = float(dist[token])
            scores = dist / next(noise) if noise is not None else None
        if scores is None:
            checks.append(StepCheck(t, token, -1, probability, False))
            continue
        top2 = scores.topk(2).values
        spread = float(top2[0] - top2[1]) if greedy else float((top2[0] - top2[1]) / top2[0])
        checks.append(StepCheck(t, token, int(scores.argmax()), probability, spread < rel_tol))
    return checks


def mismatches(checks: list[StepCheck]) -> list[StepCheck]:
    """Steps whose token differs from the reference's and is not explained by a near-tie."""
    return [c for c in checks if c.expected != -1 and c.token != c.expected and not c.near_tie]

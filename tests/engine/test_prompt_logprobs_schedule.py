"""Prompt logprobs under any schedule (mock executor with `mock_logits`, the engine's real scheduler, block manager
and overlapped steps): random prompts, step budgets, KV pools small enough to preempt, n > 1, with and without the
prefix cache. Every request's prompt logprobs equal the log-softmax of `mock_logits` after each prefix, whole,
each position once, in the request's first output that carries tokens; the generated tokens are those of the same
requests without them; no KV block is left held."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.contracts.sampling_params import SamplingParams
from hetero_infer.worker.core.engine import LLMEngine
from hetero_infer.worker.runner.mock_executor import mock_logits

VOCAB = 512
MAX_TOKENS = 6
_engines: dict[tuple, LLMEngine] = {}


def _engine(budget: int, blocks: int, prefix_caching: bool) -> LLMEngine:
    key = (budget, blocks, prefix_caching)
    if key in _engines and _engines[key].has_unfinished_requests():  # an earlier example failed midway
        del _engines[key]
    if key not in _engines:
        _engines[key] = LLMEngine(EngineConfig(
            executor="mock", mock_logits=True, mock_vocab_size=VOCAB, block_size=4, max_num_blocks=blocks,
            max_num_batched_tokens=budget, max_num_seqs=8, enable_prefix_caching=prefix_caching,
            max_model_len=64, skip_tokenizer_init=True, memory_threshold=1.0))  # admit up to the last block: preempt
    return _engines[key]


def _run(engine: LLMEngine, requests: list[tuple[list[int], SamplingParams]], preempt_at: frozenset[int] = frozenset()
         ) -> dict[str, list]:
    """Each request's outputs, step by step (the engine's cumulative RequestOutputs); before each step in
    `preempt_at`, the most recently admitted running sequence still in its prefill (else the most recent) is also
    preempted, whether or not the pool is short: a prefill cut midway, recomputed later."""
    for i, (prompt, params) in enumerate(requests):
        engine.add_request(f"r{i}", None, prompt, params)
    seen: dict[str, list] = {f"r{i}": [] for i in range(len(requests))}
    for step in range(1, 2000):
        if not engine.has_unfinished_requests():
            break
        running = engine.scheduler.running
        if step in preempt_at and running:
            engine.scheduler._preempt(next((s for s in reversed(running) if s.is_prefill), running[-1]))
        for out in engine.step():
            seen[out.request_id].append(out)
    assert not engine.has_unfinished_requests()
    bm = engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks  # nothing left holding KV blocks
    return seen


def _reference(prompt: list[int], k: int) -> list:
    out: list = [None]
    for i in range(1, len(prompt)):
        row = mock_logits(prompt, prompt[:i], VOCAB).double().log_softmax(-1)
        out.append((prompt[i], row[prompt[i]].item(), set(row.topk(k).indices.tolist()) if k else set(),
                    int((row >= row[prompt[i]] - 1e-6).sum())))
    return out


prompts = st.lists(st.integers(100, VOCAB - 1), min_size=1, max_size=30)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.lists(st.tuples(prompts, st.integers(0, 3), st.integers(1, 2), st.booleans()), min_size=1, max_size=4),
       budget=st.sampled_from([3, 8, 32]), blocks=st.sampled_from([10, 16, 64]), prefix_caching=st.booleans(),
       preempt_at=st.frozensets(st.integers(1, 40), max_size=4))
def test_prompt_logprobs_whole_once_and_first_under_any_schedule(batch, budget, blocks, prefix_caching, preempt_at):
    engine = _engine(budget, blocks, prefix_caching)
    # a prompt repeated gives the prefix cache something to hit
    requests = [(list(prompt), SamplingParams(n=n, max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True,
                                              prompt_logprobs=k if wants else None))
                for prompt, k, n, wants in batch + batch[:1]]
    with_logprobs = _run(engine, requests, preempt_at)
    without = _run(engine, [(p, SamplingParams(n=s.n, max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True))
                            for p, s in requests])
    for i, (prompt, params) in enumerate(requests):
        outs = with_logprobs[f"r{i}"]
        final = outs[-1]
        assert final.finished and final.error is None
        assert [o.token_ids for o in final.outputs] == [o.token_ids for o in without[f"r{i}"][-1].outputs]
        if params.prompt_logprobs is None:
            assert all(o.prompt_logprobs is None for o in outs)
            continue
        first = next(o for o in outs if any(s.token_ids for s in o.outputs))
        assert first.prompt_logprobs is not None  # whole, with the first tokens
        got, ranks = first.prompt_logprobs, first.prompt_logprob_ranks
        assert len(got) == len(ranks) == len(prompt) and got[0] is None and ranks[0] is None
        for pos, (token, logprob, top, rank) in enumerate(_reference(prompt, params.prompt_logprobs)[1:], start=1):
            assert abs(got[pos][token] - logprob) < 1e-5, pos
            assert set(got[pos]) == top | {token}, pos
            assert ranks[pos] == rank, pos

"""What users see when the KV pool runs short or blocks are shared, against transformers.

Forced preemption (a tiny pool), chunked prefill (a small token budget) and prefix-cache hits on blocks of a
prompt another sequence is still prefilling: greedy and seeded samples must stay what the recipe on
transformers' logits gives (tests/engine/hf_reference.py), streamed as well as not, and each test asserts that
the situation it is about actually happened.
"""

from __future__ import annotations

import asyncio
import random

from hf_reference import check_sample, mismatches, teacher_forced_logits

from hetero_infer import LLM, SamplingParams
from hetero_infer.worker.core.busy_loop import EngineRequest
from hetero_infer.worker.frontend.inproc import InprocEngineClient

MAX_NEW = 12


def random_prompts(lengths, seed: int, prefix: tuple[int, ...] = ()) -> list[list[int]]:
    rng = random.Random(seed)
    return [list(prefix) + [rng.randrange(100, 49000) for _ in range(n)] for n in lengths]


def assert_reference(hf, prompts, params, outputs, eos) -> None:
    for prompt, p, out in zip(prompts, params, outputs, strict=True):
        assert len(out.outputs) == p.n
        for sample in out.outputs:
            assert len(sample.token_ids) == MAX_NEW
            logits = teacher_forced_logits(hf, prompt, sample.token_ids)
            bad = mismatches(check_sample(logits, prompt, sample.token_ids, p, eos, sample_index=sample.index))
            assert not bad, (out.request_id, sample.index, bad)


# Greedy and seeded samples (n=2: forks share blocks, copied on write) in one batch.
MIXED = [
    SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True),
    SamplingParams(n=2, temperature=1.0, top_k=40, seed=3, max_tokens=MAX_NEW, ignore_eos=True),
    SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True),
    SamplingParams(temperature=0.8, top_p=0.9, seed=4, max_tokens=MAX_NEW, ignore_eos=True),
    SamplingParams(n=2, temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True),
]


def small_pool_llm(folder) -> LLM:
    # 6 samples of ~20 + 12 tokens need ~6 * 8 blocks of 4 at the end; 20 blocks force recompute preemption
    return LLM(str(folder), device="cpu", dtype="float32", block_size=4, max_num_blocks=20, memory_threshold=1.0)


async def stream_all(llm: LLM, prompts, params) -> dict[str, list]:
    """Every output each request's stream delivered, through the server's engine thread."""
    ae = InprocEngineClient(llm.engine)
    ae.start()
    try:
        async def one(i: int) -> list:
            stream = ae.submit([EngineRequest(f"s{i}", None, prompts[i], params[i])])
            seen = []
            while outputs := await stream.next():
                seen.extend(outputs)
            return seen

        got = await asyncio.gather(*[one(i) for i in range(len(prompts))])
    finally:
        ae.shutdown()
    return {f"s{i}": g for i, g in enumerate(got)}


async def test_streamed_equals_generated_equals_reference_under_preemption(tiny_model):
    folder, hf = tiny_model("llama")
    prompts = random_prompts([19, 22, 17, 21, 18], seed=7)
    generated_llm = small_pool_llm(folder)
    generated = generated_llm.generate(prompt_token_ids=prompts, sampling_params=MIXED)
    assert generated_llm.engine.stats().num_preemptions_total > 0
    eos = generated_llm.engine.eos_token_ids
    assert_reference(hf, prompts, MIXED, generated, eos)

    streamed_llm = small_pool_llm(folder)
    streams = await stream_all(streamed_llm, prompts, MIXED)
    assert streamed_llm.engine.stats().num_preemptions_total > 0
    for i, out in enumerate(generated):
        seen = streams[f"s{i}"]
        final = seen[-1]
        assert final.finished
        assert [s.token_ids for s in final.outputs] == [s.token_ids for s in out.outputs]
        assert [s.text for s in final.outputs] == [s.text for s in out.outputs]
        for earlier in seen[:-1]:  # each update extends the previous ones, never rewrites them
            for partial, whole in zip(earlier.outputs, final.outputs):
                assert whole.token_ids[:len(partial.token_ids)] == partial.token_ids
                assert whole.text.startswith(partial.text)
    assert len(seen) > 1  # the last request streamed in several updates


def test_prefix_hits_on_blocks_still_being_filled_with_chunked_prefill(tiny_model):
    """A long prompt is prefilled in chunks of 8 (block size 4); a request with the same prefix is admitted in
    the step that fills its last blocks and starts from the blocks computed so far; a follow-up whose prompt is
    the first one's prompt plus its answer so far (a chat's next turn) arrives while the first one decodes and
    reuses the blocks of its generated tokens; so does one that arrives after the first one finished (whose
    last token completes a block but was never computed: that block must not be reused)."""
    folder, hf = tiny_model("qwen3")
    shared = tuple(random_prompts([37], seed=21)[0])
    a, b = random_prompts([7, 6], seed=22, prefix=shared)  # 44 tokens: chunks 8 x 5 + 4; 44 + 12 = 14 blocks
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    seeded = SamplingParams(n=2, temperature=1.0, min_p=0.05, seed=5, max_tokens=MAX_NEW, ignore_eos=True)
    llm = LLM(str(folder), device="cpu", dtype="float32", block_size=4, max_num_batched_tokens=8)
    engine = llm.engine
    engine.add_request("a", None, a, greedy)
    engine.add_request("b", None, b, seeded)
    steps, done = [], {}
    while len(steps) < 9:  # a: 6 prefill steps, then 3 decodes
        done.update({o.request_id: o for o in engine.step() if o.finished})
        steps.append({s.seq.request_id: (s.seq.num_computed_tokens - s.num_new_tokens, s.num_new_tokens)
                      for s in engine.last_schedule.scheduled if s.seq.sample_index == 0})
    answer_so_far = engine.requests["a"].seqs[0].output_token_ids[:3]
    c = a + answer_so_far + random_prompts([4], seed=23)[0]
    engine.add_request("c", None, c, greedy)
    while engine.has_unfinished_requests():
        done.update({o.request_id: o for o in engine.step() if o.finished})
        steps.append({s.seq.request_id: (s.seq.num_computed_tokens - s.num_new_tokens, s.num_new_tokens)
                      for s in engine.last_schedule.scheduled if s.seq.sample_index == 0})
    a_chunks = [step["a"][1] for step in steps if "a" in step and step["a"][1] > 1]
    assert a_chunks == [8, 8, 8, 8, 8, 4]
    admitted_b = next(step for step in steps if "b" in step)
    assert admitted_b["a"] == (40, 4)  # a still filling its last blocks in that step...
    assert admitted_b["b"][0] == 36  # ...and b starts after the 9 blocks of the shared prefix, computed by a
    c_start = next(step["c"][0] for step in steps if "c" in step)
    assert c_start == 44  # the 11 full blocks of a's prompt (a's answer so far fills no block yet)
    a_all = a + done["a"].outputs[0].token_ids
    e = a_all + random_prompts([4], seed=24)[0]
    engine.add_request("e", None, e, greedy)
    done.update({o.request_id: o for o in engine.step() if o.finished})
    [first] = engine.last_schedule.scheduled
    e_start = first.seq.num_computed_tokens - first.num_new_tokens
    while engine.has_unfinished_requests():
        done.update({o.request_id: o for o in engine.step() if o.finished})
    assert e_start == len(a_all) - 4  # a's last block holds its last token, never computed: not reused
    assert_reference(hf, [a, b, c, e], [greedy, seeded, greedy, greedy], [done[r] for r in "abce"],
                     engine.eos_token_ids)


def test_preemption_mid_chunk_matches_reference(tiny_model, monkeypatch):
    """Decodes that grow in a small pool preempt a long prompt halfway through its chunked prefill (chunks of 6:
    blocks of 4 left half computed); it is recomputed, hitting its own computed blocks, still cached, and must
    produce the reference tokens."""
    folder, hf = tiny_model("llama")
    llm = LLM(str(folder), device="cpu", dtype="float32", block_size=4, max_num_blocks=20,
              max_num_batched_tokens=8, memory_threshold=1.0)
    engine = llm.engine
    preempted_mid_prefill = []
    preempt = engine.scheduler._preempt

    def spy(seq):
        if 0 < seq.num_computed_tokens < seq.num_prompt_tokens:
            preempted_mid_prefill.append((seq.request_id, seq.num_computed_tokens))
        preempt(seq)

    monkeypatch.setattr(engine.scheduler, "_preempt", spy)
    x, y = random_prompts([5, 6], seed=31)
    long = random_prompts([50], seed=32)[0]
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    seeded = SamplingParams(temperature=0.9, top_k=30, seed=9, max_tokens=MAX_NEW, ignore_eos=True)
    engine.add_request("x", None, x, greedy)
    engine.add_request("y", None, y, seeded)
    done = {o.request_id: o for o in engine.step() if o.finished}
    engine.add_request("long", None, long, greedy)
    while engine.has_unfinished_requests():
        done.update({o.request_id: o for o in engine.step() if o.finished})
    assert any(rid == "long" for rid, _ in preempted_mid_prefill), preempted_mid_prefill
    assert engine.stats().prefix_cache_hits_total > 0  # the recompute reused its computed blocks
    assert_reference(hf, [x, y, long], [greedy, seeded, greedy], [done[r] for r in ("x", "y", "long")],
                     engine.eos_token_ids)
    assert engine.block_manager.num_free_blocks == 20


def test_prompt_resent_after_an_abort_mid_chunk_matches_reference(tiny_model):
    """A client gives up on a long prompt halfway through its chunked prefill (chunks of 6, blocks of 4: the last
    block half computed) and sends it again: the retry reuses the blocks computed before the abort, computes
    the rest, and must produce the reference tokens."""
    folder, hf = tiny_model("mistral")
    llm = LLM(str(folder), device="cpu", dtype="float32", block_size=4, max_num_batched_tokens=6)
    engine = llm.engine
    prompt = random_prompts([30], seed=41)[0]
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    engine.add_request("first", None, prompt, greedy)
    for _ in range(3):
        engine.step()
    assert engine.requests["first"].seqs[0].num_computed_tokens == 18
    engine.abort_request("first")
    engine.add_request("again", None, prompt, greedy)
    done = {o.request_id: o for o in engine.step() if o.finished}
    [first] = engine.last_schedule.scheduled
    assert first.seq.num_computed_tokens - first.num_new_tokens == 16  # the 4 full blocks computed before
    while engine.has_unfinished_requests():
        done.update({o.request_id: o for o in engine.step() if o.finished})
    assert_reference(hf, [prompt], [greedy], [done["again"]], engine.eos_token_ids)

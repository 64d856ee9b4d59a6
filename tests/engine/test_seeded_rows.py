"""Seeded sampling through the step contract's data form (issue 38): the engine hands each seeded row its sample's
seed (`SamplingRow.seed`) and no generator; the executor makes the generator from it at the sequence's first sampled
step and keeps it by seq_id until the plan says the sequence finished (`SeededGenerators`), so its draws continue
from step to step, preempted or not, and the rows pickle as they are (an executor in another process)."""

from __future__ import annotations

import pickle

import torch

from hetero_infer import SamplingParams
from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.contracts.step import SamplingRow, StepPlan, sample_seed
from hetero_infer.worker.core.engine import LLMEngine
from hetero_infer.worker.runner.sampler import SeededGenerators, make_generator


def _draws(gen: torch.Generator) -> torch.Tensor:
    return torch.empty(16).exponential_(generator=gen)


def test_an_executor_keeps_each_seeded_sequences_generator_until_it_finishes() -> None:
    generators = SeededGenerators("cpu")
    plan = StepPlan([1, 2, 3], [[5], [6], [7]], [4, 4, 4], [True, True, True])
    seeded = SamplingParams(temperature=1.0, seed=7)
    rows = [SamplingRow(seeded, [1], [], seed=sample_seed(7)), SamplingRow(SamplingParams(), [1], []),
            SamplingRow(seeded, [1], [], seed=sample_seed(7, 1))]
    generators.attach(plan, rows)
    assert rows[1].generator is None and len(generators) == 2
    reference = [make_generator(7, 0), make_generator(7, 1)]  # the recipe: the generator the engine used to make
    assert torch.equal(_draws(rows[0].generator), _draws(reference[0]))
    assert torch.equal(_draws(rows[2].generator), _draws(reference[1]))
    assert not torch.equal(_draws(make_generator(7, 0)), _draws(make_generator(7, 1)))

    # the next step (sequence 2 gone, sequence 1 preempted meanwhile: the executor hears nothing of that)
    later = [SamplingRow(seeded, [1], [5], seed=sample_seed(7)), SamplingRow(seeded, [1], [7], seed=sample_seed(7, 1))]
    generators.attach(StepPlan([3, 1], [[8], [9]], [5, 5], [True, True], finished_seq_ids=[2]), later[::-1])
    assert later[0].generator is rows[0].generator and later[1].generator is rows[2].generator
    assert torch.equal(_draws(later[0].generator), _draws(reference[0]))  # the draws go on where they were

    generators.attach(StepPlan(finished_seq_ids=[1, 3]), None)
    assert len(generators) == 0


PROMPTS = [[100 + 3 * i + j for j in range(n)] for i, n in enumerate([5, 30, 9, 17, 2, 41])]


def _run(max_num_blocks: int) -> tuple[list, int, list]:
    """Seeded requests (n = 1 and 2, one unseeded beside) on the real sampler over the mock's logits; the rows each
    step hands the executor, as another process would get them (pickled before the executor sees them)."""
    engine = LLMEngine(EngineConfig(executor="mock", mock_logits=True, max_model_len=256, block_size=4,
                                    max_num_blocks=max_num_blocks, max_num_seqs=6, max_num_batched_tokens=24))
    sent: list[list[SamplingRow]] = []
    launch = engine.executor.execute_async

    def recording_launch(plan, sampling):
        if sampling is not None:
            sent.append(pickle.loads(pickle.dumps(sampling)))
        return launch(plan, sampling)

    engine.executor.execute_async = recording_launch
    for i, prompt in enumerate(PROMPTS):
        seed = None if i == 3 else 100 + i
        params = SamplingParams(temperature=1.3, top_k=40, seed=seed, n=2 if i % 2 else 1, max_tokens=24,
                                ignore_eos=True)
        engine.add_request(f"r{i}", None, prompt, params)
    deltas = []
    while engine.has_unfinished_requests():
        deltas += engine.step_deltas()
    outputs: dict[tuple[str, int], list[int]] = {}
    for d in deltas:
        for k, sample in enumerate(d.samples):
            outputs.setdefault((d.request_id, k), []).extend(sample.token_ids)
    # the executor hears of the last ones' end with the next step: every finished sequence's generator dropped
    engine.add_request("next", None, [7, 8, 9], SamplingParams(max_tokens=2))
    while engine.has_unfinished_requests():
        engine.step_deltas()
    assert len(engine.executor.generators) == 0
    seeded = {key: tokens for key, tokens in outputs.items() if key[0] != "r3"}
    return sorted(seeded.items()), engine.scheduler.num_preemptions_total, sent


def test_seeded_output_is_reproducible_with_the_generators_kept_by_the_executor() -> None:
    roomy, preempted, sent = _run(max_num_blocks=256)
    assert preempted == 0
    again, _, _ = _run(max_num_blocks=256)
    tight, preempted_tight, _ = _run(max_num_blocks=40)
    assert preempted_tight > 0  # recomputed sequences draw on from their generators where they were
    assert roomy == again == tight
    assert len({tuple(tokens) for _, tokens in roomy}) == len(roomy)  # each seed, each sample its own draws
    rows = [row for step in sent for row in step]
    assert all(row.generator is None for row in rows)  # data: no generator crosses
    assert {row.seed for row in rows} >= {sample_seed(100 + i, k) for i in (0, 1, 2, 4, 5) for k in range(1 + i % 2)}

"""The engine's scheduling features on CUDA against Hugging Face transformers, at head dims 64 and 128.

Preemption (a KV pool too small for the batch), chunked prefill (a token budget smaller than a prompt), prefix
caching (prompts sharing full blocks, some computed by an earlier request) and n > 1 (forked sequences sharing
blocks): each on a random-weight Llama built from a config (no download), float32, greedy, token-identical to
transformers' `generate` on the same device.

`pytest -m gpu` runs them on CUDA (a GPU machine); the same bodies run on the CPU under `pytest -m slow`, which
checks the tests themselves where no GPU is.
"""

from __future__ import annotations

import copy
import random
import shutil
from pathlib import Path

import pytest
import torch
from quant_testing import TINY, hf_greedy

from hetero_infer import LLM, SamplingParams
from hetero_infer.worker.runner.loader import resolve_model

HEAD_DIMS = [64, 128]
MAX_NEW = 12
NO_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
DEVICES = [
    pytest.param("cuda", marks=[pytest.mark.gpu, NO_CUDA], id="cuda"),
    pytest.param("cpu", marks=pytest.mark.slow, id="cpu"),
]


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory):
    """Factory: head_dim -> (folder, float32 HF Llama on the CPU): 4 query and 2 KV heads of `head_dim`."""
    cache: dict[int, tuple[Path, torch.nn.Module]] = {}

    def make(head_dim: int) -> tuple[Path, torch.nn.Module]:
        if head_dim not in cache:
            from transformers import AutoModelForCausalLM, LlamaConfig

            config = LlamaConfig(vocab_size=49152, tie_word_embeddings=False,
                                 **{**TINY, "hidden_size": 4 * head_dim, "head_dim": head_dim})
            torch.manual_seed(head_dim)
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
            folder = tmp_path_factory.mktemp(f"llama-hd{head_dim}")
            model.save_pretrained(folder, safe_serialization=True)
            default_folder, _ = resolve_model(None)
            for name in ("tokenizer.json", "tokenizer_config.json"):
                shutil.copy(default_folder / name, folder / name)
            cache[head_dim] = (folder, model)
        return cache[head_dim]

    return make


def prompts(lengths: list[int], seed: int, prefix: list[int] | None = None) -> list[list[int]]:
    rng = random.Random(seed)
    return [list(prefix or []) + [rng.randrange(100, 49000) for _ in range(n)] for n in lengths]


def engine(folder: Path, device: str, **kwargs) -> LLM:
    return LLM(str(folder), device=device, dtype="float32", **{"max_num_blocks": 512, **kwargs})


def greedy(n: int = 1) -> SamplingParams:
    return SamplingParams(n=n, temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)


def reference(hf: torch.nn.Module, device: str, batch: list[list[int]]) -> list[list[int]]:
    model = copy.deepcopy(hf).to(device)
    return [hf_greedy(model, p, MAX_NEW) for p in batch]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_preemption_matches_hf(llama, head_dim: int, device: str) -> None:
    folder, hf = llama(head_dim)
    batch = prompts([20, 25, 18, 30, 22, 27], seed=2)
    # 6 requests need ~6 * 3 blocks of 16 by their end: 10 blocks force recompute preemption
    llm = engine(folder, device, block_size=16, max_num_blocks=10, memory_threshold=1.0)
    ours = [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=batch, sampling_params=greedy())]
    assert llm.engine.scheduler.num_preemptions_total > 0
    assert ours == reference(hf, device, batch)
    assert llm.engine.block_manager.num_free_blocks == 10


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_chunked_prefill_matches_hf(llama, head_dim: int, device: str) -> None:
    folder, hf = llama(head_dim)
    batch = prompts([45, 7, 33], seed=3)
    # a budget of 8 tokens a step: the 45-token prompt takes 6 chunks, sharing steps with the others' decodes
    llm = engine(folder, device, block_size=4, max_num_batched_tokens=8)
    ours = [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=batch, sampling_params=greedy())]
    assert ours == reference(hf, device, batch)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_prefix_cache_hits_match_hf(llama, head_dim: int, device: str) -> None:
    folder, hf = llama(head_dim)
    shared = prompts([40], seed=9)[0]
    batch = prompts([5, 12, 1], seed=4, prefix=shared)
    llm = engine(folder, device, block_size=8)
    first = llm.generate(prompt_token_ids=batch[:1], sampling_params=greedy())
    rest = llm.generate(prompt_token_ids=batch[1:], sampling_params=greedy())
    ours = [o.outputs[0].token_ids for o in first + rest]
    assert llm.engine.stats().prefix_cache_hits_total >= 2 * 40  # both later prompts reuse the 5 shared blocks
    assert ours == reference(hf, device, batch)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_n_greedy_samples_match_hf(llama, head_dim: int, device: str) -> None:
    folder, hf = llama(head_dim)
    batch = prompts([13, 30], seed=5)  # 13 % 4 != 0: the last block is shared and copied on write
    llm = engine(folder, device, block_size=4)
    outs = llm.generate(prompt_token_ids=batch, sampling_params=greedy(n=3))
    expected = reference(hf, device, batch)
    assert [[c.token_ids for c in o.outputs] for o in outs] == [[e] * 3 for e in expected]
    assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_prompt_logprobs_match_hf(llama, head_dim: int, device: str) -> None:
    """Prompt logprobs (from the prompts' own prefill steps, in chunks of a 16-token budget: on CUDA the overlapped
    steps) against transformers' log-softmax; the generated tokens beside them unchanged."""
    folder, hf = llama(head_dim)
    batch = prompts([37, 5], seed=head_dim + 7)
    llm = engine(folder, device, max_num_batched_tokens=16)
    outs = llm.generate(prompt_token_ids=batch, sampling_params=SamplingParams(
        temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True, prompt_logprobs=2))
    assert [o.outputs[0].token_ids for o in outs] == reference(hf, device, batch)
    for prompt, out in zip(batch, outs, strict=True):
        with torch.inference_mode():
            want = hf(torch.tensor([prompt])).logits[0].double().log_softmax(-1)
        got = out.prompt_logprobs
        assert got[0] is None and len(got) == len(prompt)
        for i in range(1, len(prompt)):
            assert got[i][prompt[i]] == pytest.approx(want[i - 1, prompt[i]].item(), abs=1e-3), i
            assert set(got[i]) == set(want[i - 1].topk(2).indices.tolist()) | {prompt[i]}, i

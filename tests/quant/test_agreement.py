"""Greedy agreement of INT8 / INT4 weights with bfloat16 on the default model (SmolLM2-135M-Instruct, CPU).

Agreement is measured position-wise under teacher forcing: the bf16 model's greedy continuation
(24 tokens for each of 8 fixed chat prompts) is the shared context, and at every position the
quantized model's greedy token is compared with the bf16 model's, both computed in the same
batched prefill step. (Free-running greedy agreement up to the first mismatch compounds one
early near-tie into a whole diverged tail; `python tests/quant/test_agreement.py` prints it too.)

Targets from the issue: INT8 > 95%, INT4 > 85% of tokens, asserted here. Both formats are quantized
by GPTQ on the built-in calibration conversations (`worker/quant/calibration.py`, none of them among
these prompts); rounding to nearest scores about 0.95 (INT8) and 0.75 (INT4). See docs/benchmarks.md,
"Quantized weights".
"""

from __future__ import annotations

import time

import pytest
from quant_testing import MORE_PROMPTS, PROMPTS, forced_greedy, position_agreement, prefix_agreement

from hetero_infer import LLM, SamplingParams

MAX_NEW = 24
BOUNDS = {"int8": 0.95, "int4": 0.85}  # the targets


def chat_prompts(llm, texts: list[str] = PROMPTS) -> list[list[int]]:
    tok = llm.get_tokenizer()
    return [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True) for p in texts]


def greedy(llm, prompts: list[list[int]], max_new: int = MAX_NEW) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=max_new, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=params)]


def load(method: str | None) -> LLM:
    return LLM(device="cpu", dtype="bfloat16", quantization=method, max_num_blocks=128)


@pytest.fixture(scope="module")
def bf16():
    llm = load(None)
    prompts = chat_prompts(llm)
    continuations = greedy(llm, prompts)
    return prompts, continuations, forced_greedy(llm, prompts, continuations), llm.engine.executor.weight_bytes


@pytest.mark.slow  # ~80 s, and its margin (INT4: 169 of 192 tokens, 164 needed) depends on the CPU's bf16 numerics
@pytest.mark.parametrize("method", ["int8", "int4"])
def test_quantized_greedy_agreement_with_bf16(bf16, method):
    prompts, continuations, bf16_forced, bf16_bytes = bf16
    llm = load(method)
    agreement = position_agreement(bf16_forced, forced_greedy(llm, prompts, continuations))
    weight_bytes = llm.engine.executor.weight_bytes
    print(f"\n{method}: teacher-forced agreement with bf16 {agreement:.3f}; "
          f"weights {weight_bytes / 2**20:.1f} MiB (bf16 {bf16_bytes / 2**20:.1f} MiB)")
    assert agreement > BOUNDS[method]
    assert weight_bytes < (0.65 if method == "int8" else 0.47) * bf16_bytes


def projection_bytes(llm) -> tuple[int, int]:
    """(bytes of the quantized projections, bytes the same projections take in bf16)."""
    from hetero_infer.worker.quant.quantize import QuantizedLinear, weight_bytes

    layers = [m for m in llm.engine.executor.model.modules() if isinstance(m, QuantizedLinear)]
    return sum(weight_bytes(m) for m in layers), sum(2 * m.in_features * m.out_features for m in layers)


def main() -> None:
    """Print every number of docs/benchmarks.md "Quantized weights" (slow for INT4: 24 decode steps).

    `--rtn`: round to nearest instead of GPTQ (HETERO_INFER_GPTQ=0), the numbers before calibration;
    `--more`: the 16 prompts of MORE_PROMPTS, 32 tokens each, instead of the asserted set.
    """
    import os
    import platform
    import sys

    import torch

    if "--rtn" in sys.argv[1:]:
        os.environ["HETERO_INFER_GPTQ"] = "0"
    texts, max_new = (MORE_PROMPTS, 32) if "--more" in sys.argv[1:] else (PROMPTS, MAX_NEW)
    print(f"torch {torch.__version__}, {platform.machine()}, {torch.get_num_threads()} threads; "
          f"{'round to nearest' if os.environ.get('HETERO_INFER_GPTQ') == '0' else 'GPTQ'}; "
          f"{len(texts)} prompts x {max_new} tokens")
    llm = load(None)
    prompts = chat_prompts(llm, texts)
    start = time.perf_counter()
    ref = greedy(llm, prompts, max_new)
    seconds = time.perf_counter() - start
    ref_forced = forced_greedy(llm, prompts, ref)
    bf16_bytes = llm.engine.executor.weight_bytes
    print(f"bf16: weights {bf16_bytes / 2**20:.1f} MiB; teacher-forced vs its own free-running output "
          f"{position_agreement(ref, ref_forced):.3f}; generate {seconds:.1f} s")
    for method in ("int8", "int4"):
        del llm
        start = time.perf_counter()
        llm = load(method)
        load_seconds = time.perf_counter() - start
        ex = llm.engine.executor
        proj, proj_bf16 = projection_bytes(llm)
        forced = position_agreement(ref_forced, forced_greedy(llm, prompts, ref))
        start = time.perf_counter()
        free = greedy(llm, prompts, max_new)
        seconds = time.perf_counter() - start
        print(f"{method}: weights {ex.weight_bytes / 2**20:.1f} MiB ({ex.weight_bytes / bf16_bytes:.2f}x), "
              f"projections {proj / 2**20:.1f} MiB (bf16 {proj_bf16 / 2**20:.1f} MiB, {proj / proj_bf16:.2f}x); "
              f"teacher-forced {forced:.3f}; free-running: until first mismatch {prefix_agreement(ref, free):.3f}, "
              f"position-wise {position_agreement(ref, free):.3f}; load {load_seconds:.0f} s, generate {seconds:.1f} s")


if __name__ == "__main__":
    main()

"""What prompt logprobs cost: one request of a `--prompt-len`-token prompt and one generated token (an evaluation
harness's loglikelihood request), with and without `prompt_logprobs`, on the engine (`LLM`, the default model
unless `--model`), beside transformers computing the same logprobs (one forward pass over the prompt, then a
log-softmax) on the same machine. Medians of `--repeats` interleaved runs; prints a table.

    python benchmarks/prompt_logprobs_cost.py [--prompt-len 512] [--repeats 5] [--top 1]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

import torch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--top", type=int, default=1, help="prompt_logprobs (the top-N at each position)")
    args = parser.parse_args(argv)

    from transformers import AutoModelForCausalLM

    from hetero_infer import LLM, SamplingParams
    from hetero_infer.worker.runner.loader import resolve_model

    llm = LLM(args.model, dtype="float32", max_model_len=max(2048, args.prompt_len + 16))
    hf = AutoModelForCausalLM.from_pretrained(resolve_model(args.model)[0], dtype=torch.float32).eval()
    vocab = llm.engine.vocab_size
    times: dict[str, list[float]] = {"engine, no prompt logprobs": [], "engine, prompt_logprobs": [],
                                     "transformers forward + log_softmax": []}
    for r in range(args.repeats):
        rng = random.Random(r)  # new prompts every run: no prefix-cache hit between runs
        for name, top in (("engine, no prompt logprobs", None), ("engine, prompt_logprobs", args.top)):
            prompt = [rng.randrange(100, vocab - 1) for _ in range(args.prompt_len)]
            t = time.perf_counter()
            llm.generate(prompt_token_ids=[prompt], sampling_params=SamplingParams(
                max_tokens=1, temperature=0, prompt_logprobs=top))
            times[name].append(time.perf_counter() - t)
        t = time.perf_counter()
        with torch.inference_mode():
            logprobs = hf(torch.tensor([prompt])).logits[0].float().log_softmax(-1)
            logprobs.topk(max(args.top, 1), dim=-1)
        times["transformers forward + log_softmax"].append(time.perf_counter() - t)
    print(f"\n{args.prompt_len}-token prompt, 1 generated token, prompt_logprobs={args.top}, float32, "
          f"torch threads {torch.get_num_threads()}, median of {args.repeats}\n")
    print("| path | seconds |")
    print("|---|---:|")
    for name, values in times.items():
        print(f"| {name} | {statistics.median(values):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

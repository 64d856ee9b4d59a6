"""What prompt logprobs cost: `--batch` requests of a `--prompt-len`-token prompt and one generated token each (an
evaluation harness's loglikelihood requests), with and without `prompt_logprobs`, on the engine (`LLM`, the
default model unless `--model`, all requests in one `generate` call), beside transformers computing the same
logprobs (one forward pass over the batch of prompts, then a log-softmax) on the same machine. Medians of
`--repeats` interleaved runs; prints a table.

    python benchmarks/prompt_logprobs_cost.py [--prompt-len 512] [--batch 1] [--repeats 5] [--top 1]
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
    parser.add_argument("--batch", type=int, default=1, help="requests scored together")
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
            prompts = [[rng.randrange(100, vocab - 1) for _ in range(args.prompt_len)] for _ in range(args.batch)]
            t = time.perf_counter()
            llm.generate(prompt_token_ids=prompts, sampling_params=SamplingParams(
                max_tokens=1, temperature=0, prompt_logprobs=top), use_tqdm=False)
            times[name].append(time.perf_counter() - t)
        t = time.perf_counter()
        with torch.inference_mode():  # equal lengths: one batch, no padding
            logprobs = hf(torch.tensor(prompts)).logits.float().log_softmax(-1)
            logprobs.topk(max(args.top, 1), dim=-1)
        times["transformers forward + log_softmax"].append(time.perf_counter() - t)
    print(f"\n{args.batch} x {args.prompt_len}-token prompts, 1 generated token each, prompt_logprobs={args.top}, "
          f"float32, torch threads {torch.get_num_threads()}, median of {args.repeats}\n")
    print("| path | seconds |")
    print("|---|---:|")
    for name, values in times.items():
        print(f"| {name} | {statistics.median(values):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

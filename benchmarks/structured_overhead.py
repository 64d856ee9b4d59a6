"""What structured outputs and logit_bias cost the sampler (docs/benchmarks.md, "Structured outputs").

Times `Sampler()(logits, rows)` on a batch of the default model's vocabulary width:
- unconstrained rows with this sampler and with a baseline sampler module (the file before the feature, e.g.
  `git show 81d8a69~1:worker/runner/sampler.py > /tmp/sampler_before.py`), interleaved so load hits both alike;
- the same batch with k rows under a JSON-schema grammar or a logit_bias.

    python -m benchmarks.structured_overhead --baseline /tmp/sampler_before.py
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time

import torch

from hetero_infer.contracts.sampling_params import SamplingParams, StructuredOutputsParams
from hetero_infer.contracts.tokenizer import Tokenizer
from hetero_infer.worker.runner import sampler as current
from hetero_infer.worker.runner.loader import resolve_model
from hetero_infer.worker.structured import GrammarCache, tokenizer_info_from_hf
from hetero_infer.worker.structured.mask import apply_token_bitmasks, grammar_bitmasks

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "age", "tags"]}


def load_module(path: str):
    spec = importlib.util.spec_from_file_location("sampler_baseline", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def rows_for(module, batch: int, temperature: float, extra: dict | None = None) -> list:
    params = SamplingParams(temperature=temperature, max_tokens=100)
    rows = [module.SamplingRow(params, [1, 2, 3], [4, 5]) for _ in range(batch)]
    for i, row in (extra or {}).items():
        rows[i] = row
    return rows


def time_sampler(sample, logits, rows, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        sample(logits, rows)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--baseline", help="the sampler module before the feature")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    folder, _ = resolve_model(None)
    tok = Tokenizer.from_pretrained(folder)
    vocab = tok.vocab_size
    logits = torch.randn(args.batch, vocab)
    print(f"batch {args.batch} x vocab {vocab}, torch threads {torch.get_num_threads()}, "
          f"median of {args.repeat} calls, {args.rounds} interleaved rounds")

    modules = {"this sampler": current}
    if args.baseline:
        modules["baseline (before)"] = load_module(args.baseline)
    for temperature in (0.0, 1.0):
        results: dict[str, list[float]] = {name: [] for name in modules}
        for _ in range(args.rounds):
            for name, module in modules.items():
                rows = rows_for(module, args.batch, temperature)
                results[name].append(time_sampler(module.Sampler(all_logprobs=False), logits, rows, args.repeat))
        for name, values in results.items():
            print(f"unconstrained, temperature {temperature}: {name}: {statistics.median(values) * 1e3:.3f} ms "
                  f"(rounds {', '.join(f'{v * 1e3:.3f}' for v in values)})")

    # The only code the feature adds to an unconstrained row's path: process_logits' row scans (no tensor work).
    results = {name: [] for name in modules}
    for _ in range(args.rounds):
        for name, module in modules.items():
            rows = rows_for(module, args.batch, 1.0)
            results[name].append(time_sampler(module.process_logits, logits, rows, args.repeat * 100))
    for name, values in results.items():
        print(f"process_logits, unconstrained: {name}: {statistics.median(values) * 1e6:.1f} us")

    cache = GrammarCache(lambda: tokenizer_info_from_hf(tok.hf, vocab, sorted(tok.eos_token_ids)))
    so = StructuredOutputsParams(json=SCHEMA)
    for k in (1, 8, args.batch):
        for kind in ("grammar", "logit_bias"):
            extra = {}
            for i in range(k):
                if kind == "grammar":
                    params = SamplingParams(temperature=1.0, structured_outputs=so)
                    [mask] = grammar_bitmasks([cache.new_state(so)], [[]], vocab)  # (the engine's side)
                    extra[i] = current.SamplingRow(params, [1], [], token_bitmask=mask)
                else:
                    params = SamplingParams(temperature=1.0, logit_bias={t: 5.0 for t in range(10 * i, 10 * i + 10)})
                    extra[i] = current.SamplingRow(params, [1], [])
            rows = rows_for(current, args.batch, 1.0, extra)
            t = statistics.median(time_sampler(current.Sampler(all_logprobs=False), logits, rows, args.repeat)
                                  for _ in range(args.rounds))
            print(f"{k} of {args.batch} rows with {kind}: sampler {t * 1e3:.3f} ms", end="")
            work = [i for i in range(k)]
            if kind == "grammar":
                states = [cache.new_state(so) for _ in work]
                def step(x, _, work=work, states=states, k=k):  # the engine's fill and the sampler's mask
                    apply_token_bitmasks(x, work, grammar_bitmasks(states, [[]] * k, vocab))
                mask = statistics.median(time_sampler(step, logits.clone(), None, args.repeat)
                                         for _ in range(args.rounds))
            else:
                def step(x, _, work=work, rows=rows):
                    current.process_logits(x, [rows[i] for i in work])  # the bias rows' keys and one scatter
                mask = statistics.median(time_sampler(step, logits.clone(), None, args.repeat)
                                         for _ in range(args.rounds))
            print(f"; the {kind} step alone {mask * 1e3:.3f} ms")


if __name__ == "__main__":
    main()

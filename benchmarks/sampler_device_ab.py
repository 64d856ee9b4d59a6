"""Steps with penalties and logprobs: (a) host CPU time of sampling one such step (`sample_logits`, its results read
on the host), `--rows` sequences, a `--vocab`-token vocabulary, prompts of `--prompt` tokens and `--output` output
tokens each; (b) output tokens/s of the engine on the mock executor with sampled logits (`mock_logits`) and
`--latency` seconds of modelled device time per step, `--requests` requests with penalties and logprobs (as many
again without), where the overlap holds only if such steps need no tokens on the host before the next is built.

    python -m benchmarks.sampler_device_ab --rows 32 256 --requests 64

A/B between two trees: run it alternately from each with PYTHONPATH pointing at the tree, e.g.
`cd /tmp && PYTHONPATH=/tmp/base python -m benchmarks.sampler_device_ab`, then the same with the other tree.
For (a) alone, `--baseline-sampler OTHER_TREE/worker/runner/sampler.py` loads that tree's sampler module beside
this tree's in the same process and interleaves their repeats (far less noise than separate processes on a
shared machine; the other modules are this tree's).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from types import ModuleType

import torch

from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.contracts.sampling_params import SamplingParams
from hetero_infer.worker.core.engine import LLMEngine
from hetero_infer.worker.runner import sampler as sampler_module
from hetero_infer.worker.runner.sampler import Sampler, SamplingRow


def _params(i: int, max_tokens: int = 16) -> SamplingParams:
    """Every other row: penalties, logprobs, a logit_bias, seeded; the others plain; all temperature + top-k 50 + top-p."""
    if i % 2:
        return SamplingParams(temperature=0.8, top_k=50, top_p=0.95, max_tokens=max_tokens,
                              ignore_eos=True)
    return SamplingParams(temperature=0.8, top_k=50, top_p=0.95, seed=i, max_tokens=max_tokens, ignore_eos=True,
                          repetition_penalty=1.1, frequency_penalty=0.3, presence_penalty=0.2, logprobs=5,
                          logit_bias={11: 2.0})


def _host_results(sampler: Sampler, logits: torch.Tensor, rows: list[SamplingRow], module: ModuleType = sampler_module):
    """One step's tokens and SampledTokens on the host, in either tree's API."""
    out = module.sample_logits(sampler, logits, rows)
    if isinstance(out, tuple):  # the tree before `StepSample`
        tokens, sampled = out
        return tokens.tolist(), sampled
    return out.on_host()


def load_sampler(path: str) -> ModuleType:
    """Another tree's runner/sampler.py as a module of its own (its imports are this tree's modules)."""
    spec = importlib.util.spec_from_file_location("baseline_sampler", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def sample_time(rows: int, vocab: int, prompt: int, output: int, iters: int, repeats: int,
                modules: tuple[ModuleType, ...] = (sampler_module,)) -> list[float]:
    """Median host CPU time per step of each sampler module, their repeats interleaved."""
    steps = []
    for module in modules:
        g = torch.Generator().manual_seed(0)
        logits = torch.randn(rows, vocab, generator=g)
        batch = [module.SamplingRow(_params(i), torch.randint(0, vocab, (prompt,), generator=g).tolist(),
                                    torch.randint(0, vocab, (output,), generator=g).tolist(),
                                    module.make_generator(i) if i % 2 == 0 else None, [0]) for i in range(rows)]
        steps.append((module.Sampler(all_logprobs=False), logits, batch, module))
        _host_results(*steps[-1])
    times = [[] for _ in modules]
    for _ in range(repeats):
        for step, out in zip(steps, times, strict=True):
            start = time.thread_time()
            for _ in range(iters):
                _host_results(*step)
            out.append((time.thread_time() - start) / iters)
    return [statistics.median(t) for t in times]


def engine_rate(requests: int, latency: float, max_tokens: int) -> tuple[float, float, int]:
    """(output tokens/s, median wall ms per step, steps) of `requests` penalised requests and as many plain ones
    on the mock executor."""
    engine = LLMEngine(EngineConfig(executor="mock", mock_logits=True, mock_step_latency_s=latency,
                                    max_num_seqs=2 * requests, skip_tokenizer_init=True, mock_vocab_size=4096))
    for i in range(2 * requests):
        engine.add_request(f"r{i}", None, [100 + i, 200 + i, 300 + i] * 10, _params(i, max_tokens))
    start, tokens, steps = time.perf_counter(), 0, []
    while engine.has_unfinished_requests():
        t = time.perf_counter()
        for delta in engine.step_deltas():
            tokens += sum(len(s.token_ids) for s in delta.samples)
        steps.append(time.perf_counter() - t)
    return tokens / (time.perf_counter() - start), 1e3 * statistics.median(steps), len(steps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="*", default=[32, 256])
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--output", type=int, default=64)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--requests", type=int, nargs="*", default=[64])
    ap.add_argument("--latency", type=float, default=0.004)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--baseline-sampler", help="another tree's worker/runner/sampler.py, timed beside this one's")
    args = ap.parse_args()
    torch.set_num_threads(1)
    modules = (sampler_module,) if not args.baseline_sampler else (load_sampler(args.baseline_sampler),
                                                                   sampler_module)
    for rows in args.rows:
        times = sample_time(rows, args.vocab, args.prompt, args.output, args.iters, args.repeats, modules)
        label = ", ".join(f"{1e3 * t:.2f} ms ({m.__file__})" for m, t in zip(modules, times, strict=True))
        ratio = f"; this tree / baseline {times[1] / times[0]:.3f}" if len(times) == 2 else ""
        print(f"sample_logits, {rows} rows (half penalised + logprobs), vocab {args.vocab}: host CPU time per "
              f"step {label} (median of {args.repeats}{', interleaved' if len(times) == 2 else ''}){ratio}")
    for requests in args.requests:
        rate, step_ms, steps = engine_rate(requests, args.latency, args.max_tokens)
        print(f"mock engine, {requests} penalised + {requests} plain requests, {1e3 * args.latency:.0f} ms device "
              f"time per step: {rate:.0f} output tok/s, {step_ms:.2f} ms per step (median of {steps})")


if __name__ == "__main__":
    main()

"""Benchmarks, apart from the serving code: nothing under `hetero_infer.worker` imports this package.

- `throughput`: `hetero-infer bench`, offline throughput beside Hugging Face transformers.
- `serve`: `hetero-infer bench serve`, a serving benchmark for any OpenAI-compatible endpoint.
- `overhead`: `python -m hetero_infer.bench.overhead`, what the serving path costs over the engine alone.
- `cpu_speed`: how fast each CPU runs right now (shared machines drift).
- `contention`: busy processes beside a run (`hetero-infer bench --contention steady|bursty`).
"""

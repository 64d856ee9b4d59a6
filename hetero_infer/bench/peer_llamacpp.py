"""llama.cpp as a peer of `hetero-infer bench` (`--peers ...,llama-cpp`): llama-cpp-python's
low-level bindings in batched mode, every sequence of the workload in one `llama_decode` per
step (the approach of llama.cpp's `batched` example), greedy, no early EOS.

llama-cpp-python is optional (never a dependency of the package): without it, or without the
GGUF file of the model in the run's dtype, the peer is skipped with a message saying what to do.
The GGUF comes from the same Hugging Face folder the bench loads, converted by llama.cpp's own
`convert_hf_to_gguf.py` (benchmarks/llamacpp_gguf.py) into `gguf_path(folder, dtype)`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from hetero_infer.paths import cache_dir

SYSTEM = "llama.cpp (llama-cpp-python, batched llama_decode)"
NOT_INSTALLED = "llama-cpp: not installed: pip install llama-cpp-python (builds from source)"
GGUF_TYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}
GGML_TYPES = {"float32": 0, "float16": 1, "bfloat16": 30}  # ggml_type of the KV cache, same dtype as the weights
N_BATCH = 512  # tokens per llama_decode during the prefill


@dataclass(frozen=True)
class Entry:
    """One token of a llama_batch."""

    token: int
    pos: int
    seq: int
    logits: bool


def gguf_path(folder: Path, dtype_name: str) -> Path:
    return cache_dir() / "gguf" / f"{Path(folder).name}-{GGUF_TYPES[dtype_name]}.gguf"


def prefill_batches(prompts: list[list[int]], n_batch: int = N_BATCH) -> list[list[Entry]]:
    """Every prompt token once, in batches of at most n_batch tokens; logits at each prompt's last token."""
    entries = [Entry(tok, pos, seq, pos == len(p) - 1) for seq, p in enumerate(prompts) for pos, tok in enumerate(p)]
    return [entries[i:i + n_batch] for i in range(0, len(entries), n_batch)]


def decode_batch(next_token: dict[int, int], position: dict[int, int], remaining: dict[int, int]) -> list[Entry]:
    """One step: the last sampled token of every sequence that still has tokens to produce."""
    return [Entry(next_token[s], position[s], s, True) for s in sorted(next_token) if remaining[s] > 0]


def context_per_sequence(prompts: list[list[int]], outputs: list[int], align: int = 256) -> int:
    need = max(len(p) + o for p, o in zip(prompts, outputs))
    return -(-need // align) * align


def run_llama_cpp(folder: Path, dtype_name: str, prompts: list[list[int]], outputs: list[int],
                  threads: int) -> tuple[object | None, str | None]:
    """(Result, None) after a timed run, or (None, why it was skipped)."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return None, NOT_INSTALLED
    if dtype_name not in GGUF_TYPES:
        return None, f"llama-cpp: no GGUF type for {dtype_name}"
    path = gguf_path(folder, dtype_name)
    if not path.is_file():
        return None, (f"llama-cpp: no GGUF at {path}: python -m benchmarks.llamacpp_gguf --llama-cpp-src "
                      f"<llama.cpp sources, e.g. vendor/llama.cpp of the llama-cpp-python sdist>")
    return _timed_run(path, dtype_name, prompts, outputs, threads), None


def _timed_run(path: Path, dtype_name: str, prompts, outputs, threads: int):
    import ctypes

    import llama_cpp as lc
    import numpy as np

    from hetero_infer.bench.throughput import Result

    lc.llama_backend_init()
    model = lc.llama_model_load_from_file(str(path).encode(), lc.llama_model_default_params())
    if not model:
        raise RuntimeError(f"llama.cpp could not load {path}")
    vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))
    n = len(prompts)
    cp = lc.llama_context_default_params()
    cp.n_seq_max = n
    cp.n_ctx = n * context_per_sequence(prompts, outputs)  # split evenly: one KV stream per sequence
    cp.n_batch = cp.n_ubatch = N_BATCH
    cp.n_threads = cp.n_threads_batch = threads
    cp.type_k = cp.type_v = GGML_TYPES[dtype_name]
    ctx = lc.llama_init_from_model(model, cp)
    if not ctx:
        raise RuntimeError("llama.cpp could not create the context")
    batch = lc.llama_batch_init(max(N_BATCH, n), 0, 1)

    def decode(entries: list[Entry]) -> None:
        batch.n_tokens = len(entries)
        for i, e in enumerate(entries):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = e.token, e.pos, 1
            batch.seq_id[i][0], batch.logits[i] = e.seq, e.logits
        if lc.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")

    def argmax(i: int) -> int:
        row = lc.llama_get_logits_ith(ctx, i)
        return int(np.argmax(np.ctypeslib.as_array(ctypes.cast(row, ctypes.POINTER(ctypes.c_float)), (vocab,))))

    try:
        decode([Entry(prompts[0][0], 0, 0, True)])  # warm-up, then start from an empty cache
        lc.llama_memory_clear(lc.llama_get_memory(ctx), True)
        start = time.perf_counter()
        next_token, position, remaining = {}, {}, {}
        for entries in prefill_batches(prompts):
            decode(entries)
            for i, e in enumerate(entries):
                if e.logits:
                    next_token[e.seq], position[e.seq], remaining[e.seq] = argmax(i), e.pos + 1, outputs[e.seq] - 1
        produced = len(next_token)
        while entries := decode_batch(next_token, position, remaining):
            decode(entries)
            for i, e in enumerate(entries):
                next_token[e.seq] = argmax(i)
                position[e.seq] += 1
                remaining[e.seq] -= 1
            produced += len(entries)
        elapsed = time.perf_counter() - start
    finally:
        lc.llama_batch_free(batch)
        lc.llama_free(ctx)
        lc.llama_model_free(model)
    return Result(SYSTEM, dtype_name, produced, elapsed,
                  {"llama_cpp_python": lc.__version__, "gguf": path.name, "kv_cache": GGUF_TYPES[dtype_name]})

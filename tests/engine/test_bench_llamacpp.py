"""The llama.cpp peer of `hetero-infer bench`: its batches replay the bench's own workload, and
without llama-cpp-python the peer is skipped with an install hint (no llama_cpp needed here)."""

from __future__ import annotations

import sys

from hetero_infer.bench import peer_llamacpp as peer
from hetero_infer.bench.throughput import Workload, main


def test_prefill_batches_cover_the_default_workload_once() -> None:
    prompts, outputs = Workload().build(49152)
    batches = peer.prefill_batches(prompts, n_batch=512)
    assert all(0 < len(b) <= 512 for b in batches)
    flat = [e for b in batches for e in b]
    for seq, prompt in enumerate(prompts):
        mine = [e for e in flat if e.seq == seq]
        assert [e.token for e in mine] == prompt
        assert [e.pos for e in mine] == list(range(len(prompt)))
        assert [e.logits for e in mine] == [False] * (len(prompt) - 1) + [True]
    assert len(flat) == sum(map(len, prompts))
    assert len(prompts) == 32 and set(outputs) == {128}


def test_decode_batch_has_one_token_per_unfinished_sequence() -> None:
    entries = peer.decode_batch({0: 11, 1: 22, 2: 33}, {0: 5, 1: 9, 2: 4}, {0: 3, 1: 0, 2: 1})
    assert entries == [peer.Entry(11, 5, 0, True), peer.Entry(33, 4, 2, True)]


def test_context_holds_the_longest_sequence() -> None:
    assert peer.context_per_sequence([[1] * 200, [1] * 31], [128, 128]) == 512
    assert peer.context_per_sequence([[1] * 128], [128]) == 256


def test_gguf_file_per_dtype(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HETERO_INFER_CACHE", str(tmp_path))
    assert peer.gguf_path(tmp_path / "SmolLM2-135M-Instruct-abc", "bfloat16") == \
        tmp_path / "gguf" / "SmolLM2-135M-Instruct-abc-bf16.gguf"


def test_without_llama_cpp_the_peer_says_how_to_install(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import raises ImportError
    result, why = peer.run_llama_cpp(peer.Path("/nonexistent"), "float32", [[1, 2]], [3], threads=1)
    assert result is None
    assert why == "llama-cpp: not installed: pip install llama-cpp-python (builds from source)"


def test_bench_accepts_the_llama_cpp_peer(capsys) -> None:
    assert main(["--peers", "llama-cpp,nope", "--dtypes", "float32"]) == 2
    assert "unknown peer(s) nope" in capsys.readouterr().err

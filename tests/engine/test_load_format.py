"""`load_format` (random weights from config.json alone) and `skip_tokenizer_init` (token ids in and out): the
engine on dummy weights decodes exactly as transformers does on the same weights, the weights are made in the
target dtype (never float32 first), and every way of naming the options (LLM, flags, environment, config file)
reaches the engine, with clear errors for what cannot work."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from engine.conftest import tiny_config  # tests/ is on sys.path (tests/conftest.py)
from torch.utils._python_dispatch import TorchDispatchMode

from hetero_infer.contracts.sampling_params import SamplingParams, StructuredOutputsParams
from hetero_infer.worker.core.request_check import RequestError
from hetero_infer.worker.frontend.llm import LLM
from hetero_infer.worker.runner.dummy_weights import dummy_tensor, fill_hf_model, hf_parameter_shapes
from hetero_infer.worker.runner.loader import load_hf_config, load_model

SHAPES = Path(__file__).resolve().parents[2] / "benchmarks" / "shapes"
PROMPTS = [[101, 2023, 318, 257, 1332], [464, 3139, 286, 4881, 318, 6342, 11, 290]]


def config_folder(tmp_path: Path, arch: str, **overrides) -> Path:
    """A folder holding only config.json (no weights, no tokenizer)."""
    folder = tmp_path / arch
    folder.mkdir()
    config = tiny_config(arch)
    for key, value in overrides.items():
        setattr(config, key, value)
    config.to_json_file(folder / "config.json")
    return folder


def greedy(max_tokens: int = 12, **kwargs) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **kwargs)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen2"])
def test_dummy_weights_decode_as_transformers_does_on_the_same_weights(tmp_path, arch):
    folder = config_folder(tmp_path, arch)
    llm = LLM(str(folder), load_format="dummy", skip_tokenizer_init=True, dtype="float32", seed=7)
    ours = [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=PROMPTS, sampling_params=greedy(ignore_eos=True))]

    from transformers import AutoModelForCausalLM

    hf = fill_hf_model(AutoModelForCausalLM.from_config(load_hf_config(folder), dtype=torch.float32), seed=7).eval()
    with torch.inference_mode():
        for prompt, got in zip(PROMPTS, ours):
            out = hf.generate(torch.tensor([prompt]), max_new_tokens=12, min_new_tokens=12, do_sample=False,
                              pad_token_id=0)
            assert got == out[0, len(prompt):].tolist()
    assert len(set(ours[0])) > 1  # not one token repeated: the logits are not flat


def test_dummy_weights_follow_the_seed_and_the_config_scale(tmp_path):
    folder = config_folder(tmp_path, "llama")
    config = load_hf_config(folder)
    a = dummy_tensor("model.layers.0.mlp.up_proj.weight", torch.Size([128, 64]), config, "cpu", torch.float32, 1)
    assert torch.equal(a, dummy_tensor("model.layers.0.mlp.up_proj.weight", a.shape, config, "cpu", torch.float32, 1))
    assert not torch.equal(a, dummy_tensor("model.layers.0.mlp.up_proj.weight", a.shape, config, "cpu",
                                           torch.float32, 2))
    assert not torch.equal(a, dummy_tensor("model.layers.1.mlp.up_proj.weight", a.shape, config, "cpu",
                                           torch.float32, 1))
    bound = math.sqrt(3) * config.initializer_range  # uniform with transformers' init std
    assert a.abs().max() <= bound and a.std().item() == pytest.approx(config.initializer_range, rel=0.1)
    norm = dummy_tensor("model.layers.0.input_layernorm.weight", torch.Size([64]), config, "cpu", torch.bfloat16, 1)
    assert norm.dtype == torch.bfloat16 and torch.equal(norm, torch.ones(64, dtype=torch.bfloat16))
    assert not dummy_tensor("model.layers.0.self_attn.q_proj.bias", torch.Size([64]), config, "cpu",
                            torch.float32, 1).any()

    ids = [[5, 6, 7, 8]]
    runs = [LLM(str(folder), load_format="dummy", skip_tokenizer_init=True, dtype="float32", seed=s)
            .generate(prompt_token_ids=ids, sampling_params=greedy(ignore_eos=True))[0].outputs[0].token_ids
            for s in (3, 3, 4)]
    assert runs[0] == runs[1] and runs[0] != runs[2]


class _Allocations(TorchDispatchMode):
    """The storages that ops create or write off the meta device (views and in-place ops name a storage once):
    storage address -> (dtype, elements)."""

    def __init__(self) -> None:
        super().__init__()
        self.storages: dict[int, tuple[torch.dtype, int]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                storage = t.untyped_storage()
                self.storages[storage.data_ptr()] = (t.dtype, storage.nbytes() // t.element_size())
        return out

    def elements(self, dtype: torch.dtype) -> int:
        return sum(n for d, n in self.storages.values() if d == dtype)


def test_dummy_model_is_made_in_the_target_dtype_never_in_float32(tmp_path):
    folder = config_folder(tmp_path, "qwen3")
    config = load_hf_config(folder)
    with _Allocations() as allocations:
        model = load_model(config, folder, load_format="dummy", device=torch.device("cpu"), dtype=torch.bfloat16,
                           max_positions=64, seed=0)
    params = list(model.parameters())
    assert {p.dtype for p in params} == {torch.bfloat16}
    total = sum(p.numel() for p in params)
    float32 = allocations.elements(torch.float32)
    assert float32 < 1024, f"{float32} float32 elements allocated while loading ({total} bfloat16 parameters)"
    assert total <= allocations.elements(torch.bfloat16) <= 2 * total  # the parameters, and one tensor at a time


def test_shipped_shapes_are_the_published_models():
    """benchmarks/shapes holds config.json files only; their parameter counts are the published models'."""
    counts = {name: sum(math.prod(s) for _, s in hf_parameter_shapes(load_hf_config(SHAPES / name)))
              for name in ("qwen3-0.6b", "llama-3-8b")}
    assert counts == {"qwen3-0.6b": 596_049_920, "llama-3-8b": 8_030_261_248}
    qwen, llama = (json.loads((SHAPES / n / "config.json").read_text()) for n in ("qwen3-0.6b", "llama-3-8b"))
    assert (qwen["vocab_size"], qwen["tie_word_embeddings"]) == (151_936, True)
    assert (llama["vocab_size"], llama["num_key_value_heads"], llama["rope_theta"]) == (128_256, 8, 500000.0)
    for shape in SHAPES.iterdir():
        if shape.is_dir():
            assert sorted(p.name for p in shape.iterdir()) == ["config.json"]


def test_without_a_tokenizer_eos_comes_from_config_and_generation_config(tmp_path):
    folder = config_folder(tmp_path, "llama")
    free = LLM(str(folder), load_format="dummy", skip_tokenizer_init=True, dtype="float32")
    tokens = free.generate(prompt_token_ids=PROMPTS[1], sampling_params=greedy(ignore_eos=True))[0].outputs[0]
    assert tokens.text == "" and len(tokens.token_ids) == 12
    third = tokens.token_ids[2]
    assert third not in tokens.token_ids[:2]

    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "eos_token_id": third}))
    stopped = LLM(str(folder), load_format="dummy", skip_tokenizer_init=True, dtype="float32")
    out = stopped.generate(prompt_token_ids=PROMPTS[1], sampling_params=greedy())[0].outputs[0]
    assert out.token_ids == tokens.token_ids[:3] and out.finish_reason == "stop"

    (folder / "config.json").write_text(json.dumps({**cfg, "eos_token_id": None}))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [99999, third]}))
    gen = LLM(str(folder), load_format="dummy", skip_tokenizer_init=True, dtype="float32")
    assert gen.generate(prompt_token_ids=PROMPTS[1], sampling_params=greedy())[0].outputs[0].token_ids == \
        tokens.token_ids[:3]


def test_what_needs_a_tokenizer_is_refused_clearly(tmp_path):
    folder = config_folder(tmp_path, "llama")
    llm = LLM(str(folder), load_format="dummy", skip_tokenizer_init=True, dtype="float32")
    assert llm.get_tokenizer() is None
    with pytest.raises(ValueError, match="prompt_token_ids"):
        llm.generate("Hello")
    with pytest.raises(ValueError, match="prompt_token_ids"):
        llm.chat([{"role": "user", "content": "Hello"}])
    with pytest.raises(RequestError, match="stop strings need a tokenizer") as err:
        llm.generate(prompt_token_ids=[1, 2, 3], sampling_params=greedy(stop=["x"]))
    assert err.value.param == "stop"
    with pytest.raises(RequestError, match="structured outputs need a tokenizer"):
        llm.generate(prompt_token_ids=[1, 2, 3],
                     sampling_params=greedy(structured_outputs=StructuredOutputsParams(choice=["a", "b"])))
    assert not llm.engine.has_unfinished_requests()  # nothing queued by the refused requests
    stop_ids = llm.generate(prompt_token_ids=[1, 2, 3], sampling_params=greedy(ignore_eos=True))[0].outputs[0]
    out = llm.generate(prompt_token_ids=[1, 2, 3], sampling_params=greedy(stop_token_ids=[stop_ids.token_ids[1]]))
    assert out[0].outputs[0].token_ids == stop_ids.token_ids[:2]  # token-id stops still work


def test_a_folder_without_tokenizer_files_names_the_option(tmp_path):
    folder = config_folder(tmp_path, "llama")
    with pytest.raises(ValueError, match="--skip-tokenizer-init"):
        LLM(str(folder), load_format="dummy")


def test_dummy_weights_with_the_tokenizer_when_the_folder_has_one(tmp_path, tokenizer_dir):
    folder = config_folder(tmp_path, "llama")
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, folder / f.name)
    llm = LLM(str(folder), load_format="dummy", dtype="float32")
    out = llm.generate("The capital of France is", greedy(max_tokens=6, ignore_eos=True))[0].outputs[0]
    assert len(out.token_ids) == 6 and out.text == llm.get_tokenizer().decode(out.token_ids)


def test_load_format_values(tmp_path, tiny_model):
    with pytest.raises(ValueError, match="load_format.*auto, safetensors, gguf, dummy"):
        LLM(executor="mock", load_format="bogus")
    folder, _ = tiny_model("llama")
    with pytest.raises(ValueError, match="load_format=gguf needs a .gguf file"):
        LLM(str(folder), load_format="gguf")
    llm = LLM(str(folder), load_format="safetensors", dtype="float32")  # the checkpoint, as "auto" reads it
    auto = LLM(str(folder), dtype="float32")
    params = greedy(max_tokens=6, ignore_eos=True)
    assert llm.generate(prompt_token_ids=PROMPTS, sampling_params=params)[0].outputs[0].token_ids == \
        auto.generate(prompt_token_ids=PROMPTS, sampling_params=params)[0].outputs[0].token_ids


def run_cli(*args: str, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-m", "hetero_infer.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def test_cli_bad_load_format_is_refused_at_parse_time():
    flag = run_cli("generate", "--prompt", "x", "--load-format", "safetensor")
    assert flag.returncode == 2 and "auto,safetensors,gguf,dummy" in flag.stderr.replace(" ", "")
    env = run_cli("generate", "--prompt", "x", env={"HETERO_INFER_LOAD_FORMAT": "dumy"})
    assert env.returncode == 2 and "HETERO_INFER_LOAD_FORMAT" in env.stderr and "dummy" in env.stderr
    assert "Traceback" not in flag.stderr + env.stderr


@pytest.mark.slow  # two CLI processes on a shape folder (~80 s); LLM(load_format="dummy") is checked against transformers by the default suite
def test_cli_generate_and_bench_on_a_shape_folder(tmp_path):
    """The shipped tiny shape, token ids only: generate prints token ids; bench runs ours and transformers'
    generate on the same dummy weights (the config file and the environment set the options here)."""
    shape = SHAPES / "tiny-qwen3"
    gen = run_cli("generate", "--model", str(shape), "--load-format", "dummy", "--skip-tokenizer-init",
                  "--prompt-token-ids", "11,12,13,14", "--max-tokens", "5", "--dtype", "float32")
    assert gen.returncode == 0, gen.stderr
    ids = [int(x) for x in gen.stdout.strip().split(",")]
    assert len(ids) <= 5 and all(0 <= i < 4096 for i in ids)

    options = tmp_path / "engine.yaml"
    options.write_text("load_format: dummy\n")
    out = tmp_path / "bench.json"
    bench = run_cli("bench", "--model", str(shape), "--config", str(options), "--num-requests", "3",
                    "--min-prompt", "4", "--max-prompt", "12", "--output-len", "5", "--dtypes", "float32",
                    "--peers", "hf-generate,llama-cpp", "--no-scheduler-overhead", "--json", str(out),
                    env={"HETERO_INFER_SKIP_TOKENIZER_INIT": "1"})
    assert bench.returncode == 0, bench.stderr
    report = json.loads(out.read_text())
    assert report["load_format"] == "dummy"
    systems = {r["system"]: r["output_tokens"] for r in report["results"]}
    assert systems == {"hetero-infer": 15, "transformers generate (padded batch)": 15}
    assert "llama-cpp: skipped" in bench.stderr and "(dummy weights)" in bench.stdout

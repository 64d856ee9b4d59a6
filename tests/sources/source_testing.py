"""What the model-source tests share: the files a model needs, and a refusal read as one line."""

from __future__ import annotations

import pytest

from hetero_infer.model_source import ModelSourceError, fetch_model

MODEL_FILES = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
               "tokenizer_config.json"}


def one_line_error(ref: str) -> str:
    """fetch_model's refusal of `ref`: one line that starts with the source."""
    with pytest.raises(ModelSourceError) as info:
        fetch_model(ref)
    message = str(info.value)
    assert "\n" not in message and message.startswith(ref)
    return message

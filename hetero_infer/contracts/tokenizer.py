"""Thin wrapper over a Hugging Face tokenizer with the few operations the engine needs, and the one place an
engine gets its tokenizer (or none: `skip_tokenizer_init`) and its EOS token ids."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class Tokenizer:
    def __init__(self, hf: PreTrainedTokenizerBase, extra_eos_token_ids: Iterable[int] | None = None) -> None:
        self.hf = hf
        eos = set(extra_eos_token_ids or [])
        if hf.eos_token_id is not None:
            eos.add(hf.eos_token_id)
        self.eos_token_ids: set[int] = eos
        # What `decode(skip_special_tokens=True)` drops: the backend also skips added tokens
        # flagged special that are missing from `all_special_ids`.
        added = getattr(hf, "added_tokens_decoder", {}) or {}
        self.special_token_ids: frozenset[int] = frozenset(hf.all_special_ids) | frozenset(
            i for i, tok in added.items() if getattr(tok, "special", False)
        )

    @classmethod
    def from_pretrained(
        cls,
        path_or_folder: str | Path,
        extra_eos_token_ids: Iterable[int] | None = None,
        **kwargs: Any,
    ) -> Tokenizer:
        """Load from a HF folder or hub id (a GGUF file's: `loader.gguf_tokenizer`).

        A local folder's generation_config.json eos ids are added to the eos set.
        """
        from transformers import AutoTokenizer  # imported here: the HTTP side listens before it loads torch

        if "config" not in kwargs and (config := _model_config_for_tokenizer(Path(path_or_folder))) is not None:
            kwargs["config"] = config
        hf = AutoTokenizer.from_pretrained(str(path_or_folder), **kwargs)
        eos = set(extra_eos_token_ids or []) | _generation_config_eos(Path(path_or_folder))
        return cls(hf, eos)

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    @property
    def bos_token_id(self) -> int | None:
        return self.hf.bos_token_id

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = self.hf.encode(text, add_special_tokens=add_special_tokens)
        bos = self.hf.bos_token_id
        # A prompt that already starts with the BOS text would otherwise get BOS twice.
        if add_special_tokens and bos is not None and len(ids) > 1 and ids[0] == ids[1] == bos:
            ids = ids[1:]
        return ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            tools: list[dict[str, Any]] | None = None) -> list[int]:
        """Render messages (and `tools`, OpenAI's shape, for templates that render them) with the model's chat
        template and tokenize the result.

        Message content may be a string or a list of OpenAI-style text parts.
        """
        if not getattr(self.hf, "chat_template", None):
            raise ValueError("this tokenizer has no chat template; send a plain prompt instead")
        normalized = _check_messages(messages)
        text = self.hf.apply_chat_template(normalized, add_generation_prompt=add_generation_prompt, tokenize=False,
                                           tools=tools or None)
        # The template writes any BOS itself: tokenizing must not add another.
        return self.hf.encode(text, add_special_tokens=False)


def import_tokenizer_library() -> None:
    """Import what loading a tokenizer needs (transformers, and torch through it: seconds), ahead of the load, so
    that a process can do it while it waits for the model's folder."""
    import transformers  # noqa: F401


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")


def load_tokenizer(folder: Path, skip_tokenizer_init: bool = False) -> Tokenizer | None:
    """The model folder's tokenizer (with its generation_config.json EOS ids); None with `skip_tokenizer_init`
    (token ids in, token ids out). A folder without tokenizer files is a clear error that names the option."""
    if skip_tokenizer_init:
        return None
    folder = Path(folder)
    if folder.is_dir() and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ValueError(f"{folder} has no tokenizer files ({', '.join(TOKENIZER_FILES)}); to run on token ids "
                         "alone, pass --skip-tokenizer-init (skip_tokenizer_init=True)")
    return Tokenizer.from_pretrained(folder)


def eos_token_ids(folder: Path, hf_config: Any, tokenizer: Tokenizer | None) -> set[int]:
    """The ids that end a sequence: the tokenizer's EOS with generation_config.json's; without a tokenizer,
    config.json's `eos_token_id` with generation_config.json's."""
    if tokenizer is not None:
        return set(tokenizer.eos_token_ids)
    return _int_ids(getattr(hf_config, "eos_token_id", None)) | _generation_config_eos(Path(folder))


def _check_messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise ValueError(f"messages[{i}] must be an object with 'role' and 'content'")
        role, content = msg.get("role"), msg.get("content")
        if not isinstance(role, str) or not role:
            raise ValueError(f"messages[{i}].role must be a non-empty string")
        if isinstance(content, list):
            parts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ValueError(f"messages[{i}].content parts must be {{'type': 'text', 'text': str}}")
                parts.append(part["text"])
            content = "".join(parts)
        if not isinstance(content, str):
            raise ValueError(f"messages[{i}].content must be a string or a list of text parts")
        out.append({**msg, "role": role, "content": content})
    return out


def _model_config_for_tokenizer(folder: Path) -> Any:
    """What `AutoTokenizer` reads of the model's config, where that is all it reads: a folder whose
    tokenizer_config.json names its tokenizer class (and brings no code of its own). AutoTokenizer would load the
    model's config class for it (for a Llama model, transformers 5 imports its model-loading and distributed-tensor
    modules there: seconds of a server's start-up); it reads only the model type, the name and a `tokenizer_class`.
    None where it may read more: AutoTokenizer loads the config itself."""
    try:
        tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
        model_config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if (not isinstance(tokenizer_config, dict) or not isinstance(model_config, dict)
            or not isinstance(tokenizer_config.get("tokenizer_class"), str) or "auto_map" in tokenizer_config
            or "auto_map" in model_config or not isinstance(model_config.get("model_type"), str)):
        return None
    from transformers import PreTrainedConfig

    config = PreTrainedConfig()
    config.model_type = model_config["model_type"]
    config._name_or_path = str(folder)
    if isinstance(model_config.get("tokenizer_class"), str):
        config.tokenizer_class = model_config["tokenizer_class"]
    return config


def _generation_config_eos(folder: Path) -> set[int]:
    path = folder / "generation_config.json"
    if not path.is_file():
        return set()
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return set()
    return _int_ids(data.get("eos_token_id") if isinstance(data, dict) else None)


def _int_ids(value: Any) -> set[int]:
    """An `eos_token_id` field (an int, a list of ints or nothing) as a set."""
    if isinstance(value, int) and not isinstance(value, bool):
        return {value}
    if isinstance(value, list):
        return {e for e in value if isinstance(e, int) and not isinstance(e, bool)}
    return set()

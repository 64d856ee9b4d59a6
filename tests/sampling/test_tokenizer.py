from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from hetero_infer.contracts.tokenizer import Tokenizer
from hetero_infer.worker.runner.loader import gguf_tokenizer

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "2+2?"}],
    [
        {"role": "user", "content": "Translate: 日本語 😀"},
        {"role": "assistant", "content": "Japanese language, grinning face."},
        {"role": "user", "content": "Thanks\n\n  bye"},
    ],
]


def test_vocab_and_eos(smol_tokenizer: Tokenizer) -> None:
    assert smol_tokenizer.vocab_size == len(smol_tokenizer.hf) == 49152
    assert smol_tokenizer.eos_token_ids == {smol_tokenizer.hf.eos_token_id}
    assert smol_tokenizer.hf.convert_ids_to_tokens(smol_tokenizer.hf.eos_token_id) == "<|im_end|>"
    extra = Tokenizer(smol_tokenizer.hf, extra_eos_token_ids=[0, 7])
    assert extra.eos_token_ids == {0, 2, 7}


def test_a_gguf_s_own_bos_and_eos_win(smol_gguf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers 5.17 built SmolLM2's GGUF tokenizer with `<|im_start|>` (the BOS) as EOS: the file's
    `tokenizer.ggml.eos_token_id` (`<|im_end|>`) wins over what transformers gives."""
    import transformers

    load = transformers.AutoTokenizer.from_pretrained

    def as_5_17(*args, **kwargs):
        hf = load(*args, **kwargs)
        hf.eos_token = "<|im_start|>"
        return hf

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", as_5_17)
    tokenizer = gguf_tokenizer(smol_gguf)
    assert tokenizer.hf.eos_token == "<|im_end|>" and tokenizer.eos_token_ids == {2}
    assert tokenizer.hf.bos_token == "<|im_start|>"


def test_generation_config_eos_ids(smol_folder: Path, tmp_path: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (tmp_path / name).write_bytes((smol_folder / name).read_bytes())
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    assert Tokenizer.from_pretrained(tmp_path, extra_eos_token_ids=[5]).eos_token_ids == {0, 2, 5}
    assert Tokenizer.from_pretrained(smol_folder).eos_token_ids == {2}


@pytest.mark.parametrize("text", ["Hello world", "", "日本語 😀 👨‍👩‍👧", "<|im_start|>user\nhi<|im_end|>", "  lead"])
def test_encode_decode_follow_hf(smol_tokenizer: Tokenizer, text: str) -> None:
    hf = smol_tokenizer.hf
    ids = smol_tokenizer.encode(text)
    assert ids == hf.encode(text)
    assert smol_tokenizer.encode(text, add_special_tokens=False) == hf.encode(text, add_special_tokens=False)
    assert smol_tokenizer.decode(ids, skip_special_tokens=False) == text
    assert smol_tokenizer.decode(ids) == hf.decode(ids, skip_special_tokens=True)


def test_encode_never_doubles_bos(smol_folder: Path) -> None:
    tok = Tokenizer.from_pretrained(smol_folder, add_bos_token=True)
    bos = tok.bos_token_id
    assert tok.encode("hi")[0] == bos and tok.encode("hi")[1] != bos  # BOS is added...
    assert tok.hf.encode("<|im_start|>hi")[:2] == [bos, bos]  # ...which HF would double here
    assert tok.encode("<|im_start|>hi") == [bos] + tok.encode("hi", add_special_tokens=False)
    assert tok.encode("<|im_start|>hi", add_special_tokens=False)[:1] == [bos]


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_hf(smol_tokenizer: Tokenizer, messages: list[dict], add_generation_prompt: bool) -> None:
    got = smol_tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    expected = smol_tokenizer.hf.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False
    )
    assert got == list(expected)
    assert smol_tokenizer.decode(got, skip_special_tokens=False).endswith(
        "<|im_start|>assistant\n" if add_generation_prompt else "<|im_end|>\n"
    )


def test_chat_template_accepts_text_parts(smol_tokenizer: Tokenizer) -> None:
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "!"}]}]
    assert smol_tokenizer.apply_chat_template(parts) == smol_tokenizer.apply_chat_template(CONVERSATIONS[0])


@pytest.mark.parametrize(
    "messages",
    [
        [],
        "hello",
        None,
        ["hello"],
        [{"content": "no role"}],
        [{"role": "user"}],
        [{"role": "", "content": "x"}],
        [{"role": "user", "content": 5}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}],
    ],
)
def test_chat_template_rejects_malformed(smol_tokenizer: Tokenizer, messages) -> None:
    with pytest.raises(ValueError, match="messages"):
        smol_tokenizer.apply_chat_template(messages)


def test_chat_template_missing(smol_tokenizer: Tokenizer) -> None:
    hf = copy.copy(smol_tokenizer.hf)
    hf.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        Tokenizer(hf).apply_chat_template(CONVERSATIONS[0])


def test_special_token_ids_match_decode(smol_tokenizer: Tokenizer) -> None:
    # <repo_name> (id 3) is special for decode() although not in all_special_ids.
    assert {0, 1, 2, 3} <= smol_tokenizer.special_token_ids
    for i in sorted(smol_tokenizer.special_token_ids):
        assert smol_tokenizer.decode([i]) == ""


def test_the_model_folder_s_tokenizer_is_transformers_own(smol_folder: Path, tmp_path: Path) -> None:
    """A model folder's tokenizer is loaded with only what AutoTokenizer reads of the model's config (no model
    config class: seconds of start-up), and is the one AutoTokenizer loads with the whole config."""
    from transformers import AutoConfig, AutoTokenizer

    from hetero_infer.worker.runner.loader import resolve_model

    folder = resolve_model(None)[0]
    ours = Tokenizer.from_pretrained(folder).hf
    theirs = AutoTokenizer.from_pretrained(str(folder))
    whole = AutoTokenizer.from_pretrained(str(folder), config=AutoConfig.from_pretrained(folder))
    for reference in (theirs, whole):
        assert type(ours) is type(reference)
        assert ours.init_kwargs == reference.init_kwargs
        assert ours.get_added_vocab() == reference.get_added_vocab() and len(ours) == len(reference)
        for text in ("Hello world", "日本語 😀", "<|im_start|>user\nhi<|im_end|>", "  lead"):
            assert ours.encode(text) == reference.encode(text)
        for messages in CONVERSATIONS:
            assert ours.apply_chat_template(messages, tokenize=False) == reference.apply_chat_template(
                messages, tokenize=False)


def test_the_config_stand_in_only_where_autotokenizer_reads_no_more(smol_folder: Path, tmp_path: Path) -> None:
    from hetero_infer.contracts import tokenizer as module

    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((smol_folder / name).read_bytes())
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "tokenizer_class": "X"}))
    config = module._model_config_for_tokenizer(tmp_path)
    assert (config.model_type, config._name_or_path, config.tokenizer_class) == ("llama", str(tmp_path), "X")
    tokenizer_config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    for changed in ({**tokenizer_config, "auto_map": {"AutoTokenizer": ["a.B", None]}},
                    {k: v for k, v in tokenizer_config.items() if k != "tokenizer_class"}):
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(changed))
        assert module._model_config_for_tokenizer(tmp_path) is None  # AutoTokenizer loads the config itself
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    (tmp_path / "config.json").write_text("{not json")
    assert module._model_config_for_tokenizer(tmp_path) is None


def test_loading_the_tokenizer_imports_no_model_config_class(model_config_imports) -> None:
    """The model folder's tokenizer imports none of the model's config classes beyond those transformers imports
    for any tokenizer (none, with transformers 5.24)."""
    extra, _ = model_config_imports("from hetero_infer.contracts.tokenizer import load_tokenizer\n"
                                    "from hetero_infer.worker.runner.loader import resolve_model\n"
                                    "load_tokenizer(resolve_model(None)[0])")
    assert extra == set()

"""The router's options through the layered loader (flag > HETERO_INFER_ROUTER_* > --config file), and the
prompt hashing the prefix policy routes on."""

from __future__ import annotations

import json

import pytest

from hetero_infer.router.cli import main, resolve_options
from hetero_infer.router.hashing import block_hashes, text_block_hashes
from hetero_infer.router.prompt import request_hashes


def test_flag_beats_environment_beats_config_file(tmp_path):
    cfg = tmp_path / "router.json"
    cfg.write_text(json.dumps({"policy": "round-robin", "hold_timeout_s": 5, "block_size": 32,
                               "worker": ["http://a:1"]}))
    env = {"HETERO_INFER_ROUTER_POLICY": "least-load", "HETERO_INFER_ROUTER_HOLD_TIMEOUT_S": "7",
           "HETERO_INFER_ROUTER_WORKER": "http://b:2, http://c:3/"}
    o = resolve_options(["--config", str(cfg), "--policy", "prefix"], env)
    assert (o.policy, o.hold_timeout_s, o.block_size) == ("prefix", 7.0, 32)
    assert o.worker == ["http://b:2", "http://c:3"]
    o = resolve_options(["--worker", "http://x:1", "--worker", "http://y:2"], {"HETERO_INFER_ROUTER_CONFIG": str(cfg)})
    assert (o.policy, o.hold_timeout_s, o.worker) == ("round-robin", 5.0, ["http://x:1", "http://y:2"])


@pytest.mark.parametrize("argv, env, needle", [
    (["--policy", "random"], {}, "policy"),
    (["--hold-timeout-s", "0"], {}, "hold_timeout_s"),
    ([], {"HETERO_INFER_ROUTER_WORKER": "ftp://x"}, "worker"),
    ([], {"HETERO_INFER_ROUTER_MAX_ATTEMPTS": "0"}, "HETERO_INFER_ROUTER_MAX_ATTEMPTS"),
])
def test_bad_options_exit_2_naming_the_option(argv, env, needle, monkeypatch, capsys):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(SystemExit) as exit_:
        raise SystemExit(main(argv))
    assert exit_.value.code == 2
    assert needle in capsys.readouterr().err


def test_token_id_prompts_hash_as_given():
    ids = list(range(500, 540))
    assert request_hashes({"prompt": ids}, None, 16, 64) == (block_hashes(ids, 16), True)
    assert request_hashes({"prompt": [ids, [1, 2]]}, None, 16, 64) == (block_hashes(ids, 16), True)


def test_without_a_tokenizer_text_chunks_are_hashed():
    text = "system prompt " * 20
    assert request_hashes({"prompt": text}, None, 16, 64) == (text_block_hashes(text, 64), False)
    chat = {"messages": [{"role": "system", "content": text}, {"role": "user", "content": "hi"}]}
    other = {"messages": [{"role": "system", "content": text}, {"role": "user", "content": "bye"}]}
    (a, _), (b, _) = request_hashes(chat, None, 16, 64), request_hashes(other, None, 16, 64)
    assert len(a) >= 4 and a[:4] == b[:4]
    assert request_hashes({"prompt": 12}, None, 16, 64) == ([], False)


def test_with_the_workers_tokenizer_the_hashes_are_of_the_workers_token_ids():
    from hetero_infer.router.tokenizer_source import load_tokenizer

    tok = load_tokenizer("default")
    assert tok is not None
    messages = [{"role": "system", "content": "Be brief. " * 30}, {"role": "user", "content": "Hello"}]
    assert request_hashes({"messages": messages}, tok, 16, 64) == (block_hashes(tok.apply_chat_template(messages), 16),
                                                                   True)
    assert request_hashes({"prompt": "Be brief. " * 30}, tok, 16, 64) == (block_hashes(tok.encode("Be brief. " * 30),
                                                                                        16), True)

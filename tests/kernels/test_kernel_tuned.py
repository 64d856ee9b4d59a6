"""kernels/tuned.py: per-device tuned launch configs (loading, validation, lookup, and that the attention
wrappers use them on a compiled device and nowhere else)."""

from __future__ import annotations

import json

import pytest
import torch

from hetero_infer.kernels import _triton_attention as A
from hetero_infer.kernels import reference, tuned

DEVICE = "NVIDIA H100 80GB HBM3"
KEY = tuned.shape_key(128, 2, torch.bfloat16, 16)


def _table(device: str = DEVICE, **decode: dict) -> dict:
    return {"device": device, "kernels": {"decode": {KEY: decode or {"1": {"BLOCK_N": 32}}}}}


@pytest.fixture
def tables(tmp_path, monkeypatch):
    """No shipped tables but those written into tmp_path/shipped; the device is called DEVICE; caches cleared."""
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    monkeypatch.setattr(tuned, "CONFIG_DIR", shipped)
    monkeypatch.setattr(tuned, "device_name", lambda device: DEVICE)
    monkeypatch.delenv(tuned.ENV_VAR, raising=False)
    tuned.clear_cache()
    yield shipped
    tuned.clear_cache()


def _write(path, table) -> str:
    path.write_text(json.dumps(table))
    return str(path)


def test_device_file_names() -> None:
    assert tuned.device_file_name("NVIDIA H100 80GB HBM3") == "NVIDIA_H100_80GB_HBM3.json"
    assert tuned.device_file_name("NVIDIA H200") == "NVIDIA_H200.json"
    assert tuned.device_file_name(" NVIDIA A100-SXM4-80GB ") == "NVIDIA_A100_SXM4_80GB.json"
    assert tuned.shape_key(128, 4, torch.float16, 16) == "d128-g4-float16-p16"


def test_shipped_tables_are_valid_and_named_after_their_device() -> None:
    for path in sorted(tuned.CONFIG_DIR.glob("*.json")):
        table = tuned.load_file(path)
        assert tuned.device_file_name(table["device"]) == path.name


def test_nearest_size_is_on_a_log_scale() -> None:
    assert tuned.nearest([1, 16, 64, 256], 1) == 1
    assert tuned.nearest([1, 16, 64, 256], 8) == 16  # log2: 3 is 1 from 4 and 3 from 0
    assert tuned.nearest([1, 16, 64, 256], 3) == 1
    assert tuned.nearest([1, 16, 64, 256], 128) == 64  # a tie goes to the smaller
    assert tuned.nearest([1, 16, 64, 256], 4096) == 256


@pytest.mark.parametrize("table, words", [
    ([], "top level"),
    ({"kernels": {"gemm": {}}}, "unknown kernel"),
    ({"kernels": {"decode": {KEY: {}}}}, f"kernels.decode.{KEY}"),
    ({"kernels": {"decode": {KEY: {"x": {"BLOCK_N": 32}}}}}, "positive integer"),
    ({"kernels": {"decode": {KEY: {"0": {"BLOCK_N": 32}}}}}, "positive integer"),
    ({"kernels": {"decode": {KEY: {"1": {"BLOCK_N": 48}}}}}, "BLOCK_N: must be a power of two"),
    ({"kernels": {"decode": {KEY: {"1": {"num_warps": True}}}}}, "num_warps: must be a positive integer"),
    ({"kernels": {"decode": {KEY: {"1": {"num_stages": "3"}}}}}, "num_stages: must be a positive integer"),
    ({"kernels": {"prefill": {KEY: {"2048": {"MIN_PARTITION": 0}}}}}, "MIN_PARTITION"),
    # the decode's split-plan knobs: a string or a float would reach plan_decode_splits' arithmetic
    ({"kernels": {"decode": {KEY: {"1": {"TARGET_PROGRAMS": "264"}}}}}, "TARGET_PROGRAMS: must be a positive integer"),
    ({"kernels": {"decode": {KEY: {"1": {"TARGET_PROGRAMS": 0}}}}}, "TARGET_PROGRAMS: must be a positive integer"),
    ({"kernels": {"decode": {KEY: {"1": {"MAX_SPLITS": 16.5}}}}}, "MAX_SPLITS: must be a positive integer"),
    ({"kernels": {"decode": {KEY: {"1": {"MAX_SPLITS": -1}}}}}, "MAX_SPLITS: must be a positive integer"),
    ({"kernels": {"decode": {KEY: {"1": [64]}}}}, "a config must be an object"),
])
def test_malformed_tables_are_errors_naming_the_file_and_entry(tmp_path, table, words) -> None:
    path = tmp_path / "bad.json"
    _write(path, table)
    with pytest.raises(tuned.KernelConfigError, match=str(path)) as info:
        tuned.load_file(path)
    assert words in str(info.value)


def test_not_json_is_an_error_naming_the_file(tmp_path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"kernels": ')
    with pytest.raises(tuned.KernelConfigError, match="broken.json: not valid JSON"):
        tuned.load_file(path)


def test_unknown_keys_pass_through(tables) -> None:
    _write(tables / tuned.device_file_name(DEVICE), _table(**{"1": {"BLOCK_N": 32, "SPLIT_POLICY": "per-seq"}}))
    assert tuned.lookup("decode", KEY, 1, torch.device("cpu")) == {"BLOCK_N": 32, "SPLIT_POLICY": "per-seq"}


def test_environment_table_comes_first_then_the_shipped_one(tables, tmp_path, monkeypatch) -> None:
    _write(tables / tuned.device_file_name(DEVICE), _table(**{"1": {"BLOCK_N": 32}, "64": {"BLOCK_N": 128}}))
    other = tuned.shape_key(128, 4, torch.bfloat16, 16)
    env = {"device": DEVICE, "kernels": {"decode": {other: {"16": {"num_warps": 8}}}}}
    monkeypatch.setenv(tuned.ENV_VAR, _write(tmp_path / "tuned.json", env))
    cpu = torch.device("cpu")
    assert tuned.lookup("decode", other, 300, cpu) == {"num_warps": 8}  # the environment's table
    assert tuned.lookup("decode", KEY, 2, cpu) == {"BLOCK_N": 32}  # the shipped one, nearest batch 1
    assert tuned.lookup("decode", KEY, 40, cpu) == {"BLOCK_N": 128}
    assert tuned.lookup("prefill", KEY, 2048, cpu) is None
    assert tuned.lookup("decode", tuned.shape_key(64, 2, torch.bfloat16, 16), 1, cpu) is None


def test_none_switches_tables_off(tables, monkeypatch) -> None:
    _write(tables / tuned.device_file_name(DEVICE), _table())
    monkeypatch.setenv(tuned.ENV_VAR, "none")
    assert tuned.lookup("decode", KEY, 1, torch.device("cpu")) is None


def test_another_devices_table_from_the_environment_is_an_error(tables, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(tuned.ENV_VAR, _write(tmp_path / "h200.json", _table(device="NVIDIA H200")))
    with pytest.raises(tuned.KernelConfigError, match="tuned on 'NVIDIA H200'"):
        tuned.lookup("decode", KEY, 1, torch.device("cpu"))


def test_a_missing_environment_file_is_an_error(tables, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(tuned.ENV_VAR, str(tmp_path / "nope.json"))
    with pytest.raises(tuned.KernelConfigError, match="nope.json: cannot read it"):
        tuned.lookup("decode", KEY, 1, torch.device("cpu"))


def test_files_are_read_once(tables, monkeypatch) -> None:
    path = tables / tuned.device_file_name(DEVICE)
    _write(path, _table())
    reads = []
    load = tuned.load_file
    monkeypatch.setattr(tuned, "load_file", lambda p: reads.append(p) or load(p))
    cpu = torch.device("cpu")
    for batch in (1, 1, 2, 64, 1):
        tuned.lookup("decode", KEY, batch, cpu)
    assert reads == [path]
    _write(path, _table(**{"1": {"BLOCK_N": 128}}))
    assert tuned.lookup("decode", KEY, 1, cpu) == {"BLOCK_N": 32}  # cached until cleared
    tuned.clear_cache()
    assert tuned.lookup("decode", KEY, 1, cpu) == {"BLOCK_N": 128}


def test_configs_use_the_table_on_a_compiled_device_only(tables, monkeypatch) -> None:
    _write(tables / tuned.device_file_name(DEVICE),
           {"device": DEVICE, "kernels": {
               "decode": {KEY: {"64": {"BLOCK_N": 128, "num_warps": 8, "MIN_PARTITION": 512, "EXTRA": 1}}},
               "prefill": {KEY: {"2048": {"BLOCK_M": 64, "num_stages": 4}}}}})
    cpu = torch.device("cpu")
    interpreted_decode = A._decode_config(128, torch.bfloat16, cpu, group=2, page=16, batch=64)
    interpreted_prefill = A._prefill_config(128, torch.bfloat16, cpu, group=2, page=16, tokens=2048)
    monkeypatch.setattr(A.B, "compiled", lambda device: True)
    builtin = A._decode_config(128, torch.bfloat16, cpu, group=4, page=16, batch=64)  # no entry: the built-in
    assert builtin == {"BLOCK_N": 64, "num_warps": 4, "num_stages": 3}
    got = A._decode_config(128, torch.bfloat16, cpu, group=2, page=16, batch=100)
    assert got == {"BLOCK_N": 128, "num_warps": 8, "num_stages": 3, "MIN_PARTITION": 512, "EXTRA": 1}
    got["BLOCK_N"] = 16  # callers update the dict they get: the cached entry must not change
    assert A._decode_config(128, torch.bfloat16, cpu, group=2, page=16, batch=64)["BLOCK_N"] == 128
    assert A._prefill_config(128, torch.bfloat16, cpu, group=2, page=16, tokens=1500) == {
        "BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 8, "num_stages": 4}
    monkeypatch.setattr(A.B, "compiled", lambda device: False)
    assert A._decode_config(128, torch.bfloat16, cpu, group=2, page=16, batch=64) == interpreted_decode
    assert A._prefill_config(128, torch.bfloat16, cpu, group=2, page=16, tokens=2048) == interpreted_prefill
    assert interpreted_decode["BLOCK_N"] == 16 and "MIN_PARTITION" not in interpreted_decode


def test_a_malformed_shipped_table_fails_the_first_launch(tables, monkeypatch) -> None:
    (tables / tuned.device_file_name(DEVICE)).write_text('{"kernels": {"decode": 3}}')
    monkeypatch.setattr(A.B, "compiled", lambda device: True)
    with pytest.raises(tuned.KernelConfigError, match="NVIDIA_H100_80GB_HBM3.json"):
        A._decode_config(128, torch.bfloat16, torch.device("cpu"), group=2, page=16, batch=1)


@pytest.mark.gpu
def test_tuned_decode_and_prefill_configs_are_used_and_correct_on_cuda(tmp_path, monkeypatch) -> None:
    """On CUDA: a table from the environment (odd but valid tiles) reaches the kernels, whose outputs still
    match the reference. (Without a CUDA device, tests/kernels/conftest.py marks every gpu case skipped.)"""
    dev = torch.device("cuda")
    name = torch.cuda.get_device_name()
    key = tuned.shape_key(128, 2, torch.bfloat16, 16)
    table = {"device": name, "kernels": {"decode": {key: {"4": {"BLOCK_N": 32, "num_warps": 2, "num_stages": 2,
                                                                 "MIN_PARTITION": 64}}},
                                         "prefill": {key: {"300": {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4,
                                                                   "num_stages": 2}}}}}
    monkeypatch.setenv(tuned.ENV_VAR, _write(tmp_path / "t.json", table))
    tuned.clear_cache()
    try:
        assert A._decode_config(128, torch.bfloat16, dev, group=2, page=16, batch=4)["num_warps"] == 2
        g = torch.Generator(device=dev).manual_seed(0)
        kc = torch.randn(64, 16, 2, 128, device=dev, dtype=torch.bfloat16, generator=g)
        vc = torch.randn(64, 16, 2, 128, device=dev, dtype=torch.bfloat16, generator=g)
        bt = torch.randperm(64, device=dev, generator=g)[:60].view(4, 15).to(torch.int32)
        lens = torch.tensor([1, 100, 200, 240], device=dev, dtype=torch.int32)
        q = torch.randn(4, 4, 128, device=dev, dtype=torch.bfloat16, generator=g)
        out = A.paged_attention_decode(q, kc, vc, bt, lens, 0.088, torch.full_like(q, float("nan")))
        ref = reference.paged_attention_decode(q.float(), kc.float(), vc.float(), bt, lens, 0.088)
        assert torch.allclose(out.float(), ref, atol=2e-2, rtol=2e-2)
        qp = torch.randn(300, 4, 128, device=dev, dtype=torch.bfloat16, generator=g)
        cu = torch.tensor([0, 100, 300], device=dev, dtype=torch.int32)
        plens = torch.tensor([150, 200], device=dev, dtype=torch.int32)
        out = A.paged_attention_prefill(qp, kc, vc, bt[:2], cu, plens, 0.088, torch.full_like(qp, float("nan")))
        ref = reference.paged_attention_prefill(qp.float(), kc.float(), vc.float(), bt[:2], cu, plens, 0.088)
        assert torch.allclose(out.float(), ref, atol=2e-2, rtol=2e-2)
    finally:
        tuned.clear_cache()


def test_the_wrappers_ask_for_their_own_shape(monkeypatch) -> None:
    """paged_attention_decode / _prefill look up the config of the shape they run: GQA group, page, batch, tokens."""
    asked = []
    decode_config, prefill_config = A._decode_config, A._prefill_config
    monkeypatch.setattr(A, "_decode_config", lambda *a, **k: asked.append(("decode", a[0], k)) or decode_config(*a, **k))
    monkeypatch.setattr(A, "_prefill_config", lambda *a, **k: asked.append(("prefill", a[0], k)) or prefill_config(*a, **k))
    g = torch.Generator().manual_seed(0)
    kc, vc = torch.randn(2, 12, 8, 2, 32, generator=g)  # 12 blocks of 8 tokens, 2 KV heads, head dim 32
    bt = torch.arange(12, dtype=torch.int32).view(3, 4)
    lens = torch.tensor([5, 20, 30], dtype=torch.int32)
    q = torch.randn(3, 6, 32, generator=g)  # 6 query heads: group 3
    out = A.paged_attention_decode(q, kc, vc, bt, lens, 0.2, torch.empty_like(q))
    torch.testing.assert_close(out, reference.paged_attention_decode(q, kc, vc, bt, lens, 0.2))
    qp = torch.randn(7, 6, 32, generator=g)
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    plens = torch.tensor([3, 9], dtype=torch.int32)
    out = A.paged_attention_prefill(qp, kc, vc, bt[:2], cu, plens, 0.2, torch.empty_like(qp))
    torch.testing.assert_close(out, reference.paged_attention_prefill(qp, kc, vc, bt[:2], cu, plens, 0.2))
    assert asked == [("decode", 32, {"group": 3, "page": 8, "batch": 3}),
                     ("prefill", 32, {"group": 3, "page": 8, "tokens": 7})]

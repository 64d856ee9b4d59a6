"""benchmarks/tune_kernels.py end to end on tiny shapes in Triton's interpreter (--smoke): the search, the
reference check that skips wrong or uncompilable configs, the budget, and the table it writes (which the loader,
kernels/tuned.py, must accept)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from hetero_infer.kernels import tuned

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def tk(monkeypatch):
    spec = importlib.util.spec_from_file_location("tune_kernels", ROOT / "benchmarks" / "tune_kernels.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "tune_kernels", module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_smoke_run_writes_a_table_the_loader_reads(tk, tmp_path, monkeypatch, capsys) -> None:
    # The interpreter's times mean nothing: a stand-in clock makes BLOCK_N 32 and MIN_PARTITION 32 the fastest,
    # so the search's choice is known; the kernels themselves run (and are checked) for real.
    launched: list = []
    launch = tk.launch
    monkeypatch.setattr(tk, "launch", lambda case, x, config: launched.append(config or {}) or launch(case, x, config))

    def clock(self, fn) -> float:
        fn()
        cfg = launched[-1]
        return 100.0 - 30 * (cfg.get("BLOCK_N") == 32) - 10 * (cfg.get("MIN_PARTITION") == 32)

    monkeypatch.setattr(tk.Timer, "__call__", clock)
    monkeypatch.setenv(tuned.ENV_VAR, "/somewhere/else.json")  # switched off during the run, restored after
    assert tk.main(["--smoke", "--out", str(tmp_path / "k.json"), "--json", str(tmp_path / "r.json")]) == 0
    assert os.environ[tuned.ENV_VAR] == "/somewhere/else.json"
    table = tuned.load_file(tmp_path / "k.json")
    report = json.loads((tmp_path / "r.json").read_text())
    assert [(b["kernel"], b["size"]) for b in report["buckets"]] == [("decode", 1), ("decode", 2), ("prefill", 12)]
    assert all(b["builtin_us"] == [100.0] * len(b["cases"]) for b in report["buckets"])
    assert len(report["rows"]) == 3 and not report["stopped_by_budget"]
    decode = {"BLOCK_N": 32, "num_warps": 4, "num_stages": 1, "MIN_PARTITION": 32}  # batch 1 and 2 split the KV
    assert table["kernels"] == {
        "decode": {"d32-g2-bfloat16-p16": {"1": decode, "2": decode}},
        "prefill": {"d32-g2-bfloat16-p16": {"12": {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1}}}}
    assert report["buckets"][0]["confirm"]["ratio"] == pytest.approx(0.6)
    for b in report["buckets"][:2]:  # the decode's split threshold is searched too (4 x 8 nominal SMs)
        assert any(t["config"].get("TARGET_PROGRAMS") == 32 for t in b["tried"])
    out = capsys.readouterr().out
    assert "| decode tiny 4/2 d32 | b1 ctx 40 | 100.0 | " in out and "| 1.67x |" in out


def test_wrong_and_uncompilable_configs_are_reported_and_skipped(tk, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(tk, "grid", lambda kernel, smoke: {"BLOCK_N": (16, 24, 32), "num_warps": (4,),
                                                             "num_stages": (1,), "MIN_PARTITION": (32,),
                                                             "TARGET_PER_SM": (4,)})
    launch = tk.launch

    def corrupting(case, x, config):  # BLOCK_N 32 "computes" a wrong answer
        launch(case, x, config)
        if config and config.get("BLOCK_N") == 32:
            x.out.add_(0.5)

    monkeypatch.setattr(tk, "launch", corrupting)
    assert tk.main(["--smoke", "--only", "decode", "--json", str(tmp_path / "r.json")]) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    for b in report["buckets"]:
        errors = {t["config"]["BLOCK_N"]: t["error"] for t in b["tried"] if "error" in t}
        assert errors[32].startswith("wrong: relative error")
        assert 24 in errors and not errors[24].startswith("wrong")  # arange of 24: does not compile
        assert b["best"] is None or b["best"]["BLOCK_N"] == 16
    assert "skip decode" in capsys.readouterr().out


def test_budget_stops_the_search(tk, tmp_path) -> None:
    assert tk.main(["--smoke", "--budget-s", "0", "--out", str(tmp_path / "k.json"),
                    "--json", str(tmp_path / "r.json")]) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["stopped_by_budget"] and report["buckets"] == []
    assert tuned.load_file(tmp_path / "k.json")["kernels"] == {}


def test_refuses_without_cuda_unless_smoke(tk, capsys, monkeypatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a machine without CUDA, wherever this runs
    assert tk.main(["--budget-s", "1"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_the_gpu_cases_and_their_order(tk) -> None:
    """What a GPU run tunes (built without a GPU): the shapes of issue 24's workloads, most used first."""
    bs = tk.buckets(tk.cases(smoke=False))
    assert [(b.kernel, b.key, b.size) for b in bs][:5] == [
        ("decode", "d128-g2-bfloat16-p16", 256), ("decode", "d128-g2-bfloat16-p16", 64),
        ("decode", "d128-g2-bfloat16-p16", 16), ("decode", "d128-g2-bfloat16-p16", 1),
        ("decode", "d128-g4-bfloat16-p16", 1)]
    assert len(bs) == 12 and {b.key for b in bs} == {"d128-g2-bfloat16-p16", "d128-g4-bfloat16-p16"}
    for b in bs:
        for c in b.cases:
            assert c.size == b.size and (c.heads, c.kv_heads) in ((16, 8), (32, 8))
            if b.kernel == "decode" and b.size > 1:
                assert len(c.contexts) == b.size and min(c.contexts) >= 600 and max(c.contexts) <= 2000
            if b.kernel == "prefill":
                assert sum(c.q_lens) in (2048, 16384) and all(ctx >= q for ctx, q in zip(c.contexts, c.q_lens))
    assert [(b.kernel, b.size) for b in bs[-2:]] == [("prefill", 16384)] * 2  # an H100 engine's prefill step
    assert sorted(max(c.contexts) for c in bs[3].cases) == [pytest.approx(1300, abs=700), 16384]
    import torch

    cpu = torch.device("cpu")  # 8 nominal SMs: the built-in target is 16 programs
    one = tk.Bucket("decode", "k", 1, [tk.Case("decode", "m", 4, 2, 32, "b1", [100], [1])])
    assert tk.splits(one, {}, cpu) and not tk.splits(one, {"TARGET_PROGRAMS": 2}, cpu)
    assert tk.spills("decode", {"BLOCK_N": 128, "num_warps": 2}) and not tk.spills("decode", {"BLOCK_N": 128,
                                                                                              "num_warps": 4})
    assert tk.spills("prefill", {"BLOCK_M": 128, "num_warps": 4}) and not tk.spills("prefill", {"BLOCK_M": 64,
                                                                                                "num_warps": 4})


def test_prefill_configs_past_shared_memory_are_skipped(tk, tmp_path, monkeypatch, capsys) -> None:
    """The prefill's K/V tiles are multi-buffered (num_stages K and V tiles beside the Q tile): a config whose
    buffers exceed the device's shared memory is reported and skipped without a launch."""
    import torch

    bf16 = torch.bfloat16
    h100 = 227 * 1024
    prefill = tk.Bucket("prefill", "k", 2048, [tk.Case("prefill", "m", 32, 8, 128, "p", [2048], [2048])])
    assert tk.prefill_shared_bytes({"BLOCK_M": 128, "BLOCK_N": 64, "num_stages": 3}, 128, bf16) == 128 * 1024
    assert tk.prefill_shared_bytes({"BLOCK_M": 64, "BLOCK_N": 32, "num_stages": 2}, 80, bf16) == 48 * 1024  # d80 pads to 128
    assert tk.too_big(prefill, {"BLOCK_M": 128, "BLOCK_N": 128, "num_stages": 3}, h100) is None  # 224 KiB
    assert "needs ~272 KiB" in tk.too_big(prefill, {"BLOCK_M": 64, "BLOCK_N": 128, "num_stages": 4}, h100)
    assert tk.too_big(prefill, {"BLOCK_M": 128, "BLOCK_N": 64, "num_stages": 4}, 163 * 1024) is None  # A100: 160
    assert tk.too_big(prefill, {"BLOCK_M": 64, "BLOCK_N": 128, "num_stages": 4}, None) is None  # limit unknown
    decode = tk.Bucket("decode", "k", 1, [tk.Case("decode", "m", 32, 8, 128, "d", [100], [1])])
    assert tk.too_big(decode, {"BLOCK_N": 128, "num_stages": 4}, 1024) is None

    # the smoke search's prefill (d32 bf16, 16-row tiles, 1 stage): BLOCK_N 16 needs 3 KiB, 32 needs 5 KiB
    monkeypatch.setattr(tk, "shared_memory_limit", lambda device: 4096)
    launched: list = []
    launch = tk.launch
    monkeypatch.setattr(tk, "launch", lambda case, x, config: launched.append(config or {}) or launch(case, x, config))
    assert tk.main(["--smoke", "--only", "prefill", "--json", str(tmp_path / "r.json")]) == 0
    (bucket,) = json.loads((tmp_path / "r.json").read_text())["buckets"]
    skipped = [t for t in bucket["tried"] if t.get("error", "").startswith("skipped: needs ~5 KiB")]
    assert [t["config"]["BLOCK_N"] for t in skipped] == [32]
    assert all(c.get("BLOCK_N") != 32 for c in launched)
    assert "skip prefill" in capsys.readouterr().out

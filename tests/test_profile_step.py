"""benchmarks/profile_step.py (it profiles the engine on a GPU): its CPU-side pieces. The tables built from a
Chrome trace (synthetic events with known answers, and a real torch.profiler trace's format), the roofline floor
against a hand count of the Qwen3-0.6B shape, the steady decode state it profiles, and a clean refusal without
CUDA."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ps():
    spec = importlib.util.spec_from_file_location("profile_step", ROOT / "benchmarks" / "profile_step.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["profile_step"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("profile_step", None)


def _x(name: str, cat: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 0, "tid": 0}


def _trace(steps: int = 2) -> dict:
    events = [{"ph": "M", "name": "process_name", "pid": 0}, {"ph": "f", "name": "ac2g", "ts": 1.0}]
    for s in range(steps):
        t = 1000.0 * s
        events += [
            _x("cudaGraphLaunch", "cuda_runtime", t, 5),
            _x("sm90_xmma_gemm_bf16bf16_bf16f32", "kernel", t + 10, 300),
            _x("_decode_kernel", "kernel", t + 310, 200),
            _x("_decode_kernel", "kernel", t + 400, 200),  # overlaps the one before (another stream): 90 µs more
            _x("_rms_norm_kernel", "kernel", t + 700, 50),
            _x("Memcpy DtoH (Device -> Pinned)", "gpu_memcpy", t + 760, 10),
            _x("aten::mm", "cpu_op", t, 400),
            _x("cudaStreamSynchronize", "cuda_runtime", t + 600, 170),
        ]
    return {"traceEvents": events}


def test_union_of_intervals(ps) -> None:
    E = ps.Event
    assert ps.busy_us([]) == 0
    assert ps.busy_us([E("a", "kernel", 0, 10), E("b", "kernel", 5, 10), E("c", "kernel", 20, 5),
                       E("d", "kernel", 21, 1)]) == 20


def test_tables_from_a_trace(ps) -> None:
    events = ps.trace_events(_trace(2))
    assert len(events) == 16  # metadata and flow events are not complete events
    kernels, groups = ps.kernel_table(events, steps=2)
    busy = 300 + 290 + 50 + 10  # per step: the union of the device's intervals
    assert [(k["name"], k["group"], k["calls"], k["us"]) for k in kernels] == [
        ("_decode_kernel", "attention decode", 2, 400), ("sm90_xmma_gemm_bf16bf16_bf16f32", "matmul", 1, 300),
        ("_rms_norm_kernel", "rms norm", 1, 50), ("Memcpy DtoH (Device -> Pinned)", "copies", 1, 10)]
    assert kernels[0]["share"] == pytest.approx(400 / busy)
    assert [(g["group"], g["us"]) for g in groups][:2] == [("attention decode", 400), ("matmul", 300)]
    s = ps.step_summary(events, steps=2, wall_us=2000)
    assert s["device_busy_us"] == busy and s["wall_us"] == 1000 and s["device_idle_us"] == 1000 - busy
    assert (s["graph_launches"], s["kernel_launches"], s["kernels"], s["sync_us"]) == (1, 0, 4, 170)


def test_kernel_groups(ps) -> None:
    assert ps.group_of("_decode_reduce_kernel") == "attention decode"
    assert ps.group_of("_prefill_kernel") == "attention prefill"
    assert ps.group_of("nvjet_tst_128x64_64x4_1x2_h_bz_coopA_NNT") == "matmul"
    assert ps.group_of("void at::native::vectorized_elementwise_kernel<4, ...>") == "element-wise"
    assert ps.group_of("_write_kv_kernel") == "kv write"
    assert ps.group_of("something new") == "other"
    assert ps.short("x" * 200).endswith("...") and len(ps.short("x" * 200)) == 90


def test_floor_of_the_qwen3_shape_by_hand(ps) -> None:
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(ROOT / "benchmarks" / "shapes" / "qwen3-0.6b")
    # 28 layers of q 1024x2048, k and v 1024x1024, o 2048x1024, gate/up/down 1024x3072; the 151,936 x 1024 head
    params = 28 * (1024 * 2048 + 2 * 1024 * 1024 + 2048 * 1024 + 3 * 1024 * 3072) + 151936 * 1024
    assert params == 595_984_384
    f = ps.floors(hf, torch.bfloat16, [1000, 3000], copy_bytes_per_s=2e12)
    per_token_kv = 28 * 2 * 8 * 128 * 2  # layers x (K, V) x KV heads x head dim x bf16
    assert (f["weight_bytes"], f["kv_bytes"], f["batch"], f["mean_context"]) == (
        2 * params, per_token_kv * 4000, 2, 2000)
    assert f["floor_us"] == pytest.approx((2 * params + per_token_kv * 4000) / 2e12 * 1e6)
    assert f["weights_floor_us"] + f["kv_floor_us"] == pytest.approx(f["floor_us"])
    summary = {"wall_us": 2 * f["floor_us"], "device_busy_us": f["floor_us"] / 0.8}
    groups = [{"group": "attention decode", "us": 4 * f["kv_floor_us"]}, {"group": "matmul", "us": f["weights_floor_us"]}]
    vs = ps.against_floor(summary, groups, f)
    assert vs == pytest.approx({"step_wall": 0.5, "step_busy": 0.8, "attention_decode": 0.25, "matmul": 1.0})
    events = ps.trace_events(_trace(1))
    kernels, groups = ps.kernel_table(events, 1)
    rep = {"mode": "graphs", "summary": ps.step_summary(events, 1, 1000), "floor": f, "vs_floor": vs,
           "unprofiled_step_us": 900.0, "groups": groups, "kernels": kernels}
    text = ps.format_report(rep)
    assert "step at 50% of it" in text and "decode attention at 25% of the K/V floor" in text
    assert "| attention decode | 1 | 2 | 400.0 | 62% |" in text and "| `_decode_kernel` | attention decode |" in text
    assert "kernels are not in this trace" in text  # 4 kernels a step beside a graph launch: the graph's are hidden


def test_a_real_profiler_trace_parses(ps, tmp_path) -> None:
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(64, 64)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        (x @ x).relu_()
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    events = ps.trace_events(json.loads((tmp_path / "t.json").read_text()))
    assert any(e.name == "aten::mm" and e.dur > 0 for e in events)
    kernels, groups = ps.kernel_table(events, steps=1)
    assert kernels == [] and groups == []  # CPU ops are not device time


def test_steady_decode_state(ps) -> None:
    """Every request running and every row a decode (the real scheduler, the mock executor for speed)."""
    from hetero_infer.worker.cli_args import engine_config_from_args

    args = ps.build_parser().parse_args(["--model", str(ROOT / "benchmarks" / "shapes" / "tiny-qwen3"),
                                         "--executor", "mock", "--device", "cpu", "--dtype", "float32",
                                         "--max-num-batched-tokens", "64"])
    engine = ps.steady_engine(engine_config_from_args(args), requests=5, min_prompt=20, max_prompt=60,
                              extra_steps=10)
    sched = engine.last_schedule.scheduled
    assert len(sched) == 5 and all(not s.seq.is_prefill and s.num_new_tokens == 1 for s in sched)
    for _ in range(10):  # the window: nobody finishes inside it
        engine.step()
    assert len(engine.last_schedule.scheduled) == 5


def test_defaults_are_the_dummy_qwen3_shape_and_it_refuses_without_cuda(ps, capsys) -> None:
    from hetero_infer.worker.cli_args import engine_config_from_args

    config = engine_config_from_args(ps.build_parser().parse_args([]))
    assert (Path(config.model).name, config.load_format, config.skip_tokenizer_init, config.device,
            config.dtype) == ("qwen3-0.6b", "dummy", True, "cuda", "bfloat16")
    if torch.cuda.is_available():
        return
    assert ps.main(["--requests", "4"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err


@pytest.mark.slow  # ~15 s: an engine build on the CPU
def test_profile_mode_end_to_end_on_the_cpu(ps, monkeypatch) -> None:
    """The whole profiling path but the GPU: the engine (tiny Qwen3 shape, real torch executor on the CPU) brought
    to a steady decode, timed, profiled, its trace parsed and its floor computed (the CUDA calls stubbed)."""
    from hetero_infer.worker.cli_args import engine_config_from_args

    for name in ("synchronize", "empty_cache"):
        monkeypatch.setattr(torch.cuda, name, lambda *a: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "stand-in")
    args = ps.build_parser().parse_args([
        "--model", str(ROOT / "benchmarks" / "shapes" / "tiny-qwen3"), "--device", "cpu", "--dtype", "float32",
        "--max-num-batched-tokens", "32", "--requests", "3", "--min-prompt", "8", "--max-prompt", "12",
        "--steps", "2", "--warm-steps", "1"])
    rep = ps.profile_mode(engine_config_from_args(args), args)
    assert rep["mode"] == "graphs" and rep["device"] == "stand-in" and rep["events"] > 0
    f = rep["floor"]
    assert f["batch"] == 3 and 8 + 1 <= f["mean_context"] <= 12 + 1 + 3 + 30
    # 2 layers of q/k/v 128x(128+64+64), o 128x128, gate/up/down 128x256; the 4096 x 128 head; float32
    assert f["weight_bytes"] == 4 * (2 * (128 * 256 + 128 * 128 + 3 * 128 * 256) + 4096 * 128)
    assert rep["summary"]["wall_us"] > 0 and rep["unprofiled_step_us"] > 0 and rep["summary"]["kernels"] == 0
    assert "### graphs: 3 sequences" in ps.format_report(rep)


def test_host_tables(ps) -> None:
    events = ps.trace_events(_trace(2))
    calls = ps.runtime_calls(events, steps=2)
    assert {(r["name"], r["calls"], r["us"]) for r in calls} == {("cudaGraphLaunch", 1, 5), ("cudaStreamSynchronize", 1, 170)}

    def busy_python():
        return sum(i * i for i in range(20000))

    rows = ps.python_hotspots(busy_python, steps=3, top=50)
    genexpr = [r for r in rows if "genexpr" in r["function"]]
    assert genexpr and genexpr[0]["self_us"] > 0 and rows[0]["self_us"] >= rows[-1]["self_us"]
    assert 0 < sum(r["share"] for r in rows) <= 1.0 + 1e-9
    rep = {"mode": "graphs", "summary": ps.step_summary(events, 2, 2000), "floor": {
        "batch": 1, "mean_context": 1, "copy_gbs": 1, "floor_us": 1, "weights_floor_us": 1, "kv_floor_us": 0},
        "vs_floor": {"step_wall": None, "step_busy": None, "attention_decode": None, "matmul": None},
        "unprofiled_step_us": 1.0, "groups": [], "kernels": [], "runtime": calls, "python": rows}
    text = ps.format_report(rep)
    assert "| `cudaStreamSynchronize` | 1.0 | 170.0 |" in text and "genexpr" in text

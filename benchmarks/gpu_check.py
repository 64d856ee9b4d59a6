"""The project's GPU check on a bare H100/H200 (torch, Triton, transformers and nothing else installed, no
network, 64 MiB of files carried), in phases that can be run in one call or split over two of ~5.5 minutes each.

    python benchmarks/gpu_check.py prepare                                      # here, with network
    bash benchmarks/gpu_check.sh OUT                                            # there: suite, bench, peers (< 8 min)
    bash benchmarks/gpu_check.sh OUT --phases tune,profile,peers --budget-s 300 # there, a second call
    bash benchmarks/gpu_check.sh OUT --phases bench,peers --workloads qwen3-nano  # one workload and its peer

Phases, always in this order under one deadline (each phase in a process of its own, with its own timeout, its
log under OUT; a phase that no longer fits is skipped and said so); estimates from the H100 runs so far:
1. suite (~3-4 min): the `-m gpu` suite, every kernel case on CUDA (xdist workers), then the engine on CUDA;
2. tune (~2.5 min): benchmarks/tune_kernels.py sweeps the attention kernels' launch configs on the shapes below
   (OUT/tune.json, OUT/kernel_configs.json); the bench and profile phases of the same run read its table
   (HETERO_INFER_KERNEL_CONFIGS), a later call reads the one given by --kernel-configs, or the shipped one;
3. bench (~2.5 min): ours on nano-vllm's workload (256 requests, prompts 100-1024, outputs 100-1024, greedy,
   token ids) on the Qwen3-0.6B shape (its real 151,936-token vocabulary), dummy bf16 weights; one request
   (128-token prompt, 512 new tokens) on the same shape; the Llama-3-8B shape (16 GB of bf16 weights, decode
   bound by memory bandwidth), one request and a batch of 64, decode weight bytes/s against the copy bandwidth;
4. profile (~1.5 min): benchmarks/profile_step.py, torch.profiler over steady decode steps of 256 requests
   (~1,000-token contexts) on the Qwen3-0.6B shape, with CUDA graphs and eager (OUT/profile.json);
5. peers (what is left, at most ~3 min): transformers on the bench workloads, quickest first;
6. moe (~1 min, asked for by name): benchmarks/moe_kernel_bench.py, the fused MoE kernel on one Qwen3-30B-A3B
   layer's experts at batch 1 and 64, weight bytes/s against the copy bandwidth (OUT/moe_kernel.json);
7. kv_tier (~2 min estimated, asked for by name; owed, issue 40): benchmarks/kv_tier_gpu.py on the Llama-3-8B
   shape, the host KV tier's copies on their own CUDA streams: TTFT of a restored 8k-token prefix against
   recomputing it (target <= 1/3) and decode step time while the tier's copies run (target within 5%)
   (OUT/kv_tier.json);
8. serving (~2-3 min, asked for by name): benchmarks/serving_check.py, the OpenAI server on the GPU (Qwen3-0.6B
   shape, dummy bf16 weights) under `hetero-infer bench serve`, random 512-word prompts, 128 outputs, all at once and
   at 16 req/s, beside vLLM 0.19's published H100 numbers (OUT/serving.json).
9. lora (~4 min, asked for by name; issue 39): `python -m hetero_infer.bench.lora` on the Qwen3-0.6B and
   Llama-3-8B shapes (dummy bf16 weights): 8 random rank-16 adapters on every projection mixed in one batch of 32
   sequences against the base model alone, same engine (target: LoRA >= 0.8 x base tok/s), and the time to read
   an adapter and copy it into a slot (OUT/lora-<shape>.json); decode steps with adapters replay the decode
   runner's LoRA CUDA graphs, and the Qwen3-0.6B run is repeated with --enforce-eager (OUT/lora-<shape>-eager.json)
   for what the graphs bring (tests/lora/test_lora_gpu.py, in the suite phase, checks their tokens against eager);
10. tp (~2 min, asked for by name): benchmarks/gpu_tp_check.py, tensor parallelism on one GPU: the NCCL path at
   world size 1 inside the captured CUDA graphs against the plain executor, then tests/tp's TP=2 equivalence on
   gloo (OUT/tp.json). Owed on a machine with several GPUs: Llama-3-8B at TP=2 against TP=1.

The Qwen3-30B-A3B workloads (`--workloads qwen3moe-one,qwen3moe-nano`: 61 GB of bf16 weights, ours then
transformers', one at a time) are asked for by name too; nothing of the default call changes.

Peers run on the same GPU, same workload, same dtype, from the same config.json with random weights; a peer that
does not finish inside its timeout is reported as such (not as a number).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CARRY = ROOT / ".gpucheck"  # ignored by git; travels with the device call (`carry`)
SHAPES = ROOT / "benchmarks" / "shapes"
# What the GPU machine's image lacks (its package list: /work/.library/device/KINDS.md on the dev machines).
WHEELS = ["msgspec==0.22.0",  # contracts/kv_events.py, imported by the engine
          "pydantic==2.14.4", "pydantic-core==2.50.5", "annotated-types==0.7.0", "typing-inspection==0.4.5",
          "typing-extensions==4.16.0", "gguf==0.19.0", "xgrammar==0.2.8", "apache-tvm-ffi==0.1.15.post2",
          "pytest-asyncio==1.5.0"]
DEFAULT_MODEL_FILES = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                       "special_tokens_map.json", "chat_template.jinja"]
NANO = dict(requests=256, min_prompt=100, max_prompt=1024, min_output=100, max_output=1024)


# -- prepare (on a machine with network) -----------------------------------------------------------------------
def prepare(py: str) -> None:
    """Wheels for the GPU machine's Python 3.12 and the default model's config + tokenizer (not its weights)."""
    whl = CARRY / "whl"
    whl.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", py, "--implementation", "cp", "--platform", "manylinux_2_28_x86_64",
                    "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64",
                    "--platform", "manylinux_2_27_x86_64", "-d", str(whl), *WHEELS], check=True)
    from hetero_infer.worker.runner.loader import DEFAULT_MODEL_ENV, resolve_model

    os.environ.pop(DEFAULT_MODEL_ENV, None)
    folder, _ = resolve_model(None)
    dest = CARRY / "default-model"
    dest.mkdir(parents=True, exist_ok=True)
    for name in DEFAULT_MODEL_FILES:
        if (folder / name).is_file():
            shutil.copy(folder / name, dest / name)
    size = sum(f.stat().st_size for f in CARRY.rglob("*") if f.is_file())
    print(f"prepared {CARRY} ({size / 2**20:.1f} MiB): carry it with the device call")


# -- on the GPU machine ------------------------------------------------------------------------------------------
class Run:
    def __init__(self, out: Path, budget_s: float) -> None:
        self.out, self.t0, self.budget = out, time.monotonic(), budget_s
        self.phases: list[dict] = []

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.t0)

    def phase(self, name: str, cmd: list[str], need_s: float, timeout_s: float, env: dict | None = None) -> dict:
        """Run one phase in its own process group, logged to OUT/<name>.log; skipped if it no longer fits."""
        rec = {"phase": name, "cmd": " ".join(cmd)}
        if self.left() < need_s:
            rec["status"] = f"skipped ({self.left():.0f} s left < {need_s:.0f} s)"
            print(f"=== SKIP {name}: {rec['status']}", flush=True)
            self.phases.append(rec)
            return rec
        timeout = min(timeout_s, self.left())
        print(f"=== [{time.monotonic() - self.t0:.0f}s] {name} (timeout {timeout:.0f}s)", flush=True)
        log = self.out / f"{name}.log"
        start = time.monotonic()
        with open(log, "w") as f:
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, **(env or {})},
                                    start_new_session=True)
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)  # xdist workers too: nothing runs on into the next phase
                proc.wait()
                rc = "timeout"
        rec.update(status="ok" if rc == 0 else f"rc={rc}", seconds=round(time.monotonic() - start, 1))
        tail = log.read_text(errors="replace").splitlines()[-15:]
        print("\n".join(tail), flush=True)
        print(f"--- {name}: {rec['status']} in {rec['seconds']} s", flush=True)
        self.phases.append(rec)
        return rec


def stand_in_default_model(dest: Path) -> Path:
    """The default model's config and tokenizer with random float32 weights (the GGUF does not travel)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if (dest / "model.safetensors").is_file():
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    src = CARRY / "default-model"
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src), dtype=torch.float32)
    model.save_pretrained(dest, safe_serialization=True)
    for f in src.iterdir():
        if f.name not in ("config.json",) and not f.name.endswith(".safetensors"):
            shutil.copy(f, dest / f.name)
    return dest


def _head() -> str:
    """The checkout's commit (a copied tree's .git may be older than its files: GPU_CHECK_COMMIT says which)."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def bench_cmd(shape: str, out_json: Path, *, requests: int, min_prompt: int, max_prompt: int, min_output: int,
              max_output: int, extra: tuple[str, ...] = ()) -> list[str]:
    return [sys.executable, "-m", "hetero_infer.cli", "bench", "--model", str(SHAPES / shape), "--load-format",
            "dummy", "--skip-tokenizer-init", "--device", "cuda", "--dtypes", "bfloat16", "--peers", "none",
            "--no-scheduler-overhead", "--num-requests", str(requests), "--min-prompt", str(min_prompt),
            "--max-prompt", str(max_prompt), "--min-output", str(min_output), "--max-output", str(max_output),
            "--json", str(out_json), *extra]


def peer_cmd(shape: str, out_json: Path, which: str, *, requests: int, min_prompt: int, max_prompt: int,
             min_output: int, max_output: int, deadline_s: float | None = None) -> list[str]:
    return [sys.executable, str(Path(__file__)), "peer", str(SHAPES / shape), which, str(out_json),
            *map(str, (requests, min_prompt, max_prompt, min_output, max_output)),
            *([f"--deadline-s={deadline_s:.0f}"] if deadline_s is not None else [])]


PEER_BUILD_S = 30  # a peer's start-up before its clock (imports, the model built and filled on the GPU, warm-up)


def peer(folder: str, which: str, out_json: str, *workload: str, deadline_s: float | None = None) -> None:
    """One transformers peer on the bench's own workload (random weights from the shape's config.json). The
    continuous-batching peer stops at `deadline_s` of generation and writes how far it got (not a rate)."""
    import torch

    from hetero_infer.bench import throughput as T
    from hetero_infer.worker.runner.loader import load_hf_config

    n, pmin, pmax, omin, omax = map(int, workload)
    prompts, outputs = T.Workload(n, pmin, pmax, omin, omax, 0).build(load_hf_config(Path(folder)).vocab_size)
    device = torch.device(os.environ.get("GPU_CHECK_DEVICE", "cuda"))
    if which == "hf-cb":
        try:
            r = T.run_hf_continuous(Path(folder), torch.bfloat16, device, prompts, outputs, load_format="dummy",
                                    deadline_s=deadline_s)
        except TimeoutError as e:
            Path(out_json).write_text(json.dumps({"system": "transformers continuous batching",
                                                  "status": f"did not finish: {e}"}))
            print(f"PEER did not finish: {e}")
            return
    else:
        r = T.run_hf_generate(Path(folder), torch.bfloat16, device, prompts, outputs, load_format="dummy")
    Path(out_json).write_text(json.dumps({"system": r.system, "output_tokens": r.output_tokens, "seconds": r.seconds,
                                          "tokens_per_s": r.tokens_per_s}))
    print(f"PEER {r.system}: {r.output_tokens} tokens in {r.seconds:.2f} s = {r.tokens_per_s:.1f} tok/s")


PHASES = ("suite", "tune", "bench", "profile", "peers", "moe", "kv_tier", "serving", "lora", "tp")  # the order they run in
# One run of at most 8 minutes on a bare H100 (2026-11-27: install and stand-in 22 s, suite 161 s, bench 107 s,
# peers 40-60 s each, the slowest last and skipped when the budget is spent).
DEFAULT_PHASES = ("suite", "bench", "peers")
DEFAULT_BUDGET_S = 450.0
TUNE_SEARCH_S = 100  # tune_kernels.py's own deadline (compiles and timings); the phase adds start-up and inputs
W1 = dict(requests=1, min_prompt=128, max_prompt=128, min_output=512, max_output=512)
W64 = dict(requests=64, min_prompt=128, max_prompt=128, min_output=128, max_output=128)
BENCH_PLAN = [  # (name, shape, workload, ours' extra flags, peer, peer timeout)
    ("qwen3-nano", "qwen3-0.6b", NANO, (), "hf-cb", 300),  # the slowest: last, with what the budget leaves
    ("qwen3-one", "qwen3-0.6b", W1, ("--gpu-memory-utilization", "0.3"), "hf-generate", 60),  # 40 s was too short (H100)
    ("llama8b-one", "llama-3-8b", {**W1, "min_output": 256, "max_output": 256}, (), "hf-generate", 40),
    ("llama8b-64", "llama-3-8b", W64, (), "hf-generate", 40),
    # Qwen3-30B-A3B (issue 38): 128 experts, top 8; transformers loops over the experts a step hits
    ("qwen3moe-one", "qwen3-30b-a3b", {**W1, "min_output": 256, "max_output": 256}, (), "hf-generate", 120),
    ("qwen3moe-nano", "qwen3-30b-a3b", NANO, (), "hf-cb", 300),
]
OPT_IN = ("qwen3moe-one", "qwen3moe-nano")  # run only when --workloads names them


def _known_names(text: str, known: list[str], what: str) -> list[str]:
    """The comma-separated names of `text`, in `known`'s order; an unknown or no name is argparse's error."""
    names = {n.strip() for n in text.split(",") if n.strip()}
    unknown = sorted(names - set(known))
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown {what}(s) {', '.join(unknown) or '(none given)'}; "
                                         f"known: {', '.join(known)}")
    return [n for n in known if n in names]


def parse_phases(text: str) -> list[str]:
    return _known_names(text, list(PHASES), "phase")


def parse_workloads(text: str) -> list[str]:
    return _known_names(text, [p[0] for p in BENCH_PLAN], "workload")


def tune_cmd(out: Path, search_s: float) -> list[str]:
    return [sys.executable, str(ROOT / "benchmarks" / "tune_kernels.py"), "--out", str(out / "kernel_configs.json"),
            "--json", str(out / "tune.json"), "--budget-s", f"{search_s:.0f}"]


def moe_cmd(out: Path) -> list[str]:
    return [sys.executable, str(ROOT / "benchmarks" / "moe_kernel_bench.py"), "--device", "cuda", "--json",
            str(out / "moe_kernel.json")]


def kv_tier_cmd(out: Path) -> list[str]:
    return [sys.executable, str(ROOT / "benchmarks" / "kv_tier_gpu.py"), "--json", str(out / "kv_tier.json")]


def serving_cmd(out: Path) -> list[str]:
    return [sys.executable, str(ROOT / "benchmarks" / "serving_check.py"), "--device", "cuda", "--json",
            str(out / "serving.json")]


def tp_cmd(out: Path) -> list[str]:
    return [sys.executable, str(ROOT / "benchmarks" / "gpu_tp_check.py"), "--device", "cuda", "--json",
            str(out / "tp.json")]


LORA_RUNS = (("qwen3-0.6b", False), ("qwen3-0.6b", True), ("llama-3-8b", False))  # (shape, enforce_eager)


def lora_cmd(shape: str, out_json: Path, eager: bool = False) -> list[str]:
    return [sys.executable, "-m", "hetero_infer.bench.lora", "--model", str(SHAPES / shape), "--load-format", "dummy",
            "--device", "cuda", "--dtype", "bfloat16", "--adapters", "8", "--rank", "16", "--seqs", "32",
            "--prompt-len", "128", "--max-tokens", "128", "--rounds", "3", "--json", str(out_json),
            *(["--enforce-eager"] if eager else [])]


def profile_cmd(out: Path, modes: str) -> list[str]:
    return [sys.executable, str(ROOT / "benchmarks" / "profile_step.py"), "--json", str(out / "profile.json"),
            "--modes", modes]


def kernel_configs_source(out: Path, tune_rec: dict | None, given: Path | None, device: str) -> tuple[dict, dict]:
    """(env for the bench and profile phases, what the summary says about it): this run's tuned table, else the
    one given if it was tuned on this kind of device, else nothing set (the device's shipped table, if any, or the
    built-in configs). A call that landed on another kind of GPU than the call that tuned still runs."""
    from hetero_infer.kernels import tuned

    tuned_file = out / "kernel_configs.json"
    if tune_rec is not None and tuned_file.is_file():  # every entry passed the reference check, even if a bucket
        path = tuned_file                                # failed (rc=1); a file cut short fails to load below
    elif given is not None:
        path = given
    else:
        return {}, {"source": "shipped table or built-in (kernels/configs/)"}
    try:
        table = tuned.load_file(path)
    except tuned.KernelConfigError as exc:  # the workloads still run, and the summary says why without it
        return {}, {"source": f"shipped table or built-in: {exc}"}
    if tuned.device_file_name(table.get("device", device)) != tuned.device_file_name(device):
        return {}, {"source": f"shipped table or built-in: {path} was tuned on {table['device']}, not {device}"}
    entries = sum(len(sizes) for shapes in table.get("kernels", {}).values() for sizes in shapes.values())
    return {"HETERO_INFER_KERNEL_CONFIGS": str(path.resolve())}, {"source": str(path), "entries": entries}


def check(out: Path, budget_s: float, phases: list[str], kernel_configs: Path | None = None,
          workloads: list[str] | None = None) -> int:
    out.mkdir(parents=True, exist_ok=True)
    plan = [p for p in BENCH_PLAN if p[0] in workloads] if workloads else [p for p in BENCH_PLAN if p[0] not in OPT_IN]
    run = Run(out, budget_s)
    import torch
    import transformers
    import triton

    env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "transformers": transformers.__version__, "python": sys.version.split()[0],
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    env["git"] = os.environ.get("GPU_CHECK_COMMIT") or _head()
    print("env:", json.dumps(env), "phases:", ",".join(phases), flush=True)
    results: dict = {"env": env, "phases_asked": phases, "benches": {}}
    if "suite" in phases:
        t = time.monotonic()
        os.environ["HETERO_INFER_DEFAULT_MODEL_DIR"] = str(stand_in_default_model(Path("/tmp/gpucheck/default-model")))
        print(f"default-model stand-in in {time.monotonic() - t:.1f} s", flush=True)
        pytest = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "-rfE",
                  "--durations=15", "-W", "ignore"]
        workers = str(min(12, max(2, (os.cpu_count() or 4) - 2)))
        run.phase("suite-kernels", [*pytest, "tests/kernels", "-n", workers, "--timeout", "120",
                                    f"--junitxml={out}/kernels.xml"], 40, 150, env={"OMP_NUM_THREADS": "1"})
        # the rest of the gpu-marked tests (the engine on CUDA): mostly host work (engine builds, graph captures,
        # transformers' references), so a few workers; the tests that read the free memory share one (xdist_group)
        run.phase("suite-engine", [*pytest, *engine_gpu_test_files(), "-n", "4", "--dist", "loadgroup",
                                   "-rP", "--timeout", "150", f"--junitxml={out}/engine.xml"], 40, 170)
    tune_rec = None
    if "tune" in phases:
        search = min(TUNE_SEARCH_S, run.left() - 50)
        tune_rec = run.phase("tune", tune_cmd(out, max(search, 10)), 60, search + 50)
        if (out / "tune.json").is_file():
            results["tune"] = json.loads((out / "tune.json").read_text())
    kernel_env, results["kernel_configs"] = kernel_configs_source(out, tune_rec, kernel_configs, env["device"])
    print("kernel configs:", json.dumps(results["kernel_configs"]), flush=True)
    if "bench" in phases:
        for name, shape, wl, extra, _, _ in plan:  # ours first: a peer that runs long takes no number of ours
            ours_json = out / f"{name}.json"
            rec = run.phase(name, bench_cmd(shape, ours_json, extra=extra, **wl), 30, 120, env=kernel_env)
            entry = results["benches"][name] = {"shape": shape, "workload": wl, "ours": rec["status"]}
            if ours_json.is_file():
                entry["ours_report"] = json.loads(ours_json.read_text())
    if "profile" in phases:
        modes = "graphs,eager" if run.left() >= 150 else "graphs"  # eager names the kernels a graph hides
        run.phase("profile", profile_cmd(out, modes), 60, 150, env=kernel_env)
        if (out / "profile.json").is_file():
            results["profile"] = json.loads((out / "profile.json").read_text())
    if "peers" in phases:
        for name, shape, wl, _, peer_name, peer_timeout in sorted(plan, key=lambda p: p[5]):  # quickest first
            peer_json = out / f"{name}-peer.json"
            deadline = max(min(peer_timeout, run.left()) - PEER_BUILD_S, 5) if peer_name == "hf-cb" else None
            prec = run.phase(f"{name}-peer", peer_cmd(shape, peer_json, peer_name, **wl, deadline_s=deadline), 20,
                             peer_timeout)
            entry = results["benches"].setdefault(name, {"shape": shape, "workload": wl, "ours": "not run"})
            entry["peer"] = json.loads(peer_json.read_text()) if peer_json.is_file() else {
                "system": peer_name, "status": prec["status"]}
    if "moe" in phases:
        run.phase("moe", moe_cmd(out), 30, 120)
        if (out / "moe_kernel.json").is_file():
            results["moe_kernel"] = json.loads((out / "moe_kernel.json").read_text())
    if "kv_tier" in phases:
        run.phase("kv_tier", kv_tier_cmd(out), 60, 240)
        if (out / "kv_tier.json").is_file():
            results["kv_tier"] = json.loads((out / "kv_tier.json").read_text())
    if "serving" in phases:
        run.phase("serving", serving_cmd(out), 90, 300)
        if (out / "serving.json").is_file():
            results["serving"] = json.loads((out / "serving.json").read_text())
    if "lora" in phases:
        for shape, eager in LORA_RUNS:
            name = f"{shape}-eager" if eager else shape
            lora_json = out / f"lora-{name}.json"
            run.phase(f"lora-{name}", lora_cmd(shape, lora_json, eager), 40, 150)
            if lora_json.is_file():
                results.setdefault("lora", {})[name] = json.loads(lora_json.read_text())
    if "tp" in phases:
        run.phase("tp", tp_cmd(out), 60, 240)
        if (out / "tp.json").is_file():
            results["tp"] = json.loads((out / "tp.json").read_text())
    results["phases"] = run.phases
    (out / "gpu_check.json").write_text(json.dumps(results, indent=2))
    print()
    print(summary(results))
    return 0 if all(p["status"] == "ok" for p in run.phases if not p["phase"].endswith("-peer")) else 1


def engine_gpu_test_files() -> list[str]:
    """The test files outside tests/kernels that hold gpu-marked tests. Collecting all of tests/ there would import
    what the GPU machine lacks (openai, kopf, moto, ...) and fail the phase at collection."""
    tests = ROOT / "tests"
    return sorted(str(f.relative_to(ROOT)) for f in tests.rglob("test_*.py")
                  if f.relative_to(tests).parts[0] != "kernels" and "pytest.mark.gpu" in f.read_text())


def summary(results: dict) -> str:
    e = results["env"]
    lines = [f"GPU check on {e['device']} at {e['git']} ({e['date']}): torch {e['torch']}, Triton {e['triton']}, "
             f"transformers {e['transformers']}",
             "", "| phase | status | seconds |", "|---|---|---|"]
    lines += [f"| {p['phase']} | {p['status']} | {p.get('seconds', '-')} |" for p in results["phases"]]
    tune = results.get("tune")
    if tune:
        stopped = ", stopped by its budget" if tune.get("stopped_by_budget") else ""
        lines += ["", f"Tuned attention configs ({tune.get('seconds', '?')} s{stopped}; copy bandwidth "
                      f"{tune.get('copy_gbs', 0):.0f} GB/s; built-in vs best, each checked against the reference):",
                  "", "| " + " | ".join(tune["header"]) + " |", "|" + "|".join("---" for _ in tune["header"]) + "|"]
        lines += ["| " + " | ".join(map(str, row)) + " |" for row in tune["rows"]]
    if "kernel_configs" in results:
        kc = results["kernel_configs"]
        lines += ["", f"Kernel configs of the bench and profile phases: {kc['source']}"
                      + (f" ({kc['entries']} entries)" if "entries" in kc else "")]
    if results["benches"]:
        lines += ["", "| workload | hetero-infer tok/s | ms/token (1 request) | decode weight GB/s vs copy | peer "
                      "| peer tok/s | ours/peer |", "|---|---|---|---|---|---|---|"]
    for name, b in results["benches"].items():
        rep = b.get("ours_report", {})
        ours = next((r for r in rep.get("results", []) if r["system"].startswith("hetero-infer")), None)
        tok_s = ours["tokens_per_s"] if ours else None
        per_token = f"{1e3 / tok_s:.2f}" if tok_s and b["workload"]["requests"] == 1 else "-"
        vs_copy = (ours or {}).get("extra", {}).get("weight_gbs_vs_copy")
        p = b.get("peer", {})
        ptok = p.get("tokens_per_s")
        lines.append(f"| {name} | {f'{tok_s:.0f}' if tok_s else b['ours']} | {per_token} | "
                     f"{f'{vs_copy:.2f}' if vs_copy else '-'} | {p.get('system', '-')} | "
                     f"{f'{ptok:.0f}' if ptok else p.get('status', '-')} | "
                     f"{f'{tok_s / ptok:.2f}x' if tok_s and ptok else '-'} |")
    lines += step_split(results["benches"])
    moe = results.get("moe_kernel")
    if moe:
        lines += ["", f"Fused MoE kernel (one Qwen3-30B-A3B layer, {moe['dtype']}; copy {moe['copy_gbs']:.0f} GB/s):",
                  "", "| batch | experts hit | µs | weight GB/s | vs copy |", "|---|---|---|---|---|"]
        lines += [f"| {r['batch']} | {r['experts_hit']} | {r['us']:.1f} | {r['weight_gbs']:.0f} | {r['vs_copy']:.2f} |"
                  for r in moe["rows"]]
    lines += serving_summary(results.get("serving"))
    lora = results.get("lora")
    if lora:
        lines += ["", "LoRA (8 adapters of rank 16 mixed in 32 sequences vs the base alone, one engine):", "",
                  "| shape | CUDA graphs | LoRA graph steps | base tok/s | LoRA tok/s | LoRA / base | adapter read s "
                  "| slot copy s |", "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {shape} | {'on' if r.get('cuda_graphs') else 'off'} | {r.get('lora_graph_steps', '-')} | "
                  f"{r['base_tok_s']:.0f} | {r['lora_tok_s']:.0f} | {r['ratio']:.2f} | "
                  f"{r['adapter_read_s']:.3f} | {r['slot_copy_s']:.3f} |" for shape, r in lora.items()]
    lines += profile_summary(results.get("profile"))
    return "\n".join(lines)


def serving_summary(serving: dict | None) -> list[str]:
    """The serving phase's runs against vLLM's published numbers (requests/s unbounded, TPOT at 16 req/s)."""
    if not serving:
        return []
    pub = serving["published_vllm"]
    lines = ["", f"Serving ({serving['shape']}, {serving['device']}, {serving['input_words']}-word prompts, "
                 f"{serving['output_len']} outputs; vLLM {pub['version']} on {pub['device']}: "
                 f"{pub['req_per_s_unbounded']} req/s unbounded, TPOT {pub['tpot_ms_at_16']} ms at 16 req/s):",
             "", "| rate | req/s | output tok/s | TTFT p50 ms | TPOT p50 ms | failed |", "|---|---|---|---|---|---|"]
    for run in serving.get("runs", []):
        r = run.get("result")
        if r is None:
            lines.append(f"| {run['request_rate']} | rc={run['rc']} | - | - | - | - |")
            continue
        lines.append(f"| {run['request_rate']} | {r['request_throughput']:.1f} | {r['output_throughput']:.0f} | "
                     f"{r['ttft_ms']['p50']:.1f} | {r['tpot_ms']['p50']:.2f} | {r['failed']} |")
    if serving.get("error"):
        lines.append(f"(error: {serving['error']})")
    return lines


def step_split(benches: dict) -> list[str]:
    """Where each of ours' runs went: decode steps against the rest, the slowest steps, and any Triton compile
    inside the timed run (the first H100 run lost two thirds of the nano workload to those)."""
    lines = []
    for name, b in benches.items():
        ours = next((r for r in b.get("ours_report", {}).get("results", [])
                     if r["system"].startswith("hetero-infer")), None)
        ex = (ours or {}).get("extra", {})
        if "decode_s" in ex:
            lines.append(f"- {name}: {ex['steps']} steps in {ours['seconds']:.2f} s; decode steps "
                         f"{ex['decode_s']:.2f} s ({ex['decode_steps']}), the others {ex['other_s']:.2f} s "
                         f"({ex['other_steps']}); slowest {ex.get('slowest_steps', '-')}; Triton compiles in the "
                         f"run: {ex.get('jit_compiles_in_run', 0)}")
    return ["", *lines] if lines else []


def profile_summary(profile: dict | None) -> list[str]:
    """One row per profiled mode: where a steady decode step's time goes, against its roofline floor."""
    if not profile:
        return []

    def pct(x):
        return f"{100 * x:.0f}%" if x is not None else "-"

    lines = ["", "Steady decode step (benchmarks/profile_step.py; floor: weights + K/V bytes at the copy bandwidth):",
             "", "| mode | batch, mean context | step wall µs | device busy µs | device idle µs | floor µs "
                 "| step vs floor | decode attention vs K/V floor | matmuls vs weights floor | top groups (µs) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in profile.get("reports", []):
        s, f, vs = r["summary"], r["floor"], r["vs_floor"]
        top = ", ".join(f"{g['group']} {g['us']:.0f}" for g in r["groups"][:4])
        lines.append(f"| {r['mode']} | {f['batch']}, {f['mean_context']:.0f} | {s['wall_us']:.0f} | "
                     f"{s['device_busy_us']:.0f} | {s['device_idle_us']:.0f} | {f['floor_us']:.0f} | "
                     f"{pct(vs['step_wall'])} | {pct(vs['attention_decode'])} | {pct(vs['matmul'])} | {top} |")
    lines += [f"| {mode} | failed | | | | | | | | |" for mode in profile.get("failed", [])]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    pp = sub.add_parser("prepare", help="download the wheels and copy the default tokenizer into .gpucheck/")
    pp.add_argument("--python-version", default="3.12")
    pc = sub.add_parser("check", help="run the check (on the GPU machine)")
    pc.add_argument("out", type=Path)
    pc.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                    help=f"the deadline of the whole call (default {DEFAULT_BUDGET_S:.0f}: with the install and the "
                         "summary, the default phases end inside 8 minutes)")
    pc.add_argument("--phases", type=parse_phases, default=list(DEFAULT_PHASES),
                    help=f"comma-separated, run in this order whatever the order given: {','.join(PHASES)} "
                         f"(default {','.join(DEFAULT_PHASES)}: tune and profile are for a second call)")
    pc.add_argument("--kernel-configs", type=Path,
                    help="a tuned table (an earlier call's OUT/kernel_configs.json) for the bench and profile "
                         "phases, when this call does not tune")
    pc.add_argument("--workloads", type=parse_workloads,
                    help=f"comma-separated, the bench and peers phases' workloads (default all but "
                         f"{','.join(OPT_IN)}: {','.join(p[0] for p in BENCH_PLAN if p[0] not in OPT_IN)})")
    pe = sub.add_parser("peer")
    pe.add_argument("args", nargs="+")
    pe.add_argument("--deadline-s", type=float)
    a = p.parse_args(argv)
    if a.cmd == "prepare":
        prepare(a.python_version)
        return 0
    if a.cmd == "peer":
        peer(*a.args, deadline_s=a.deadline_s)
        return 0
    return check(a.out, a.budget_s, a.phases, a.kernel_configs, a.workloads)


if __name__ == "__main__":
    sys.exit(main())

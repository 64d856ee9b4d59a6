"""The project's GPU check: one run of at most ~8 minutes on a bare H100/H200 (torch, Triton, transformers and
nothing else installed, no network, 64 MiB of files carried).

    python benchmarks/gpu_check.py prepare          # here, with network: wheels + the default model's tokenizer
    bash benchmarks/gpu_check.sh OUT                # there: everything below, one table, OUT/gpu_check.json

Phases, in priority order under one deadline (each phase in a process of its own, with its own timeout, its log
under OUT; a phase that no longer fits is skipped and said so):
1. the `-m gpu` suite: every kernel case on CUDA (xdist workers), then the engine on CUDA (tests/gpu);
2. nano-vllm's workload (256 requests, prompts 100-1024, outputs 100-1024, greedy, token ids) on the Qwen3-0.6B
   shape (its real 151,936-token vocabulary), dummy bf16 weights; transformers' continuous batching beside it;
3. one request (128-token prompt, 512 new tokens) on the same shape, beside transformers `generate`;
4. the Llama-3-8B shape (16 GB of bf16 weights, decode bound by memory bandwidth): one request and a batch of
   64, beside transformers `generate`; decode weight bytes/s against the copy bandwidth measured in the run.

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
WHEELS = ["pydantic==2.14.4", "pydantic-core==2.50.5", "annotated-types==0.7.0", "typing-inspection==0.4.5",
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
             min_output: int, max_output: int) -> list[str]:
    return [sys.executable, str(Path(__file__)), "peer", str(SHAPES / shape), which, str(out_json),
            *map(str, (requests, min_prompt, max_prompt, min_output, max_output))]


def peer(folder: str, which: str, out_json: str, *workload: str) -> None:
    """One transformers peer on the bench's own workload (random weights from the shape's config.json)."""
    import torch

    from hetero_infer.bench import throughput as T
    from hetero_infer.worker.runner.loader import load_hf_config

    n, pmin, pmax, omin, omax = map(int, workload)
    prompts, outputs = T.Workload(n, pmin, pmax, omin, omax, 0).build(load_hf_config(Path(folder)).vocab_size)
    fn = {"hf-generate": T.run_hf_generate, "hf-cb": T.run_hf_continuous}[which]
    r = fn(Path(folder), torch.bfloat16, torch.device(os.environ.get("GPU_CHECK_DEVICE", "cuda")), prompts, outputs,
           load_format="dummy")
    Path(out_json).write_text(json.dumps({"system": r.system, "output_tokens": r.output_tokens, "seconds": r.seconds,
                                          "tokens_per_s": r.tokens_per_s}))
    print(f"PEER {r.system}: {r.output_tokens} tokens in {r.seconds:.2f} s = {r.tokens_per_s:.1f} tok/s")


def check(out: Path, budget_s: float, suite: bool, benches: bool) -> int:
    out.mkdir(parents=True, exist_ok=True)
    run = Run(out, budget_s)
    import torch
    import transformers
    import triton

    env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "transformers": transformers.__version__, "python": sys.version.split()[0],
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    env["git"] = os.environ.get("GPU_CHECK_COMMIT") or _head()
    print("env:", json.dumps(env), flush=True)
    t = time.monotonic()
    os.environ["HETERO_INFER_DEFAULT_MODEL_DIR"] = str(stand_in_default_model(Path("/tmp/gpucheck/default-model")))
    print(f"default-model stand-in in {time.monotonic() - t:.1f} s", flush=True)
    pytest = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "-rfE",
              "--durations=15", "-W", "ignore"]
    results: dict = {"env": env, "benches": {}}
    if suite:
        workers = str(min(12, max(2, (os.cpu_count() or 4) - 2)))
        run.phase("suite-kernels", [*pytest, "tests/kernels", "-n", workers, "--timeout", "120",
                                    f"--junitxml={out}/kernels.xml"], 40, 150, env={"OMP_NUM_THREADS": "1"})
        # the rest of the gpu-marked tests (the engine on CUDA): mostly host work (engine builds, graph captures,
        # transformers' references), so a few workers; the tests that read the free memory share one (xdist_group)
        run.phase("suite-engine", [*pytest, "tests", "--ignore=tests/kernels", "-n", "4", "--dist", "loadgroup",
                                   "-rP", "--timeout", "150", f"--junitxml={out}/engine.xml"], 40, 170)
    if benches:
        w1 = dict(requests=1, min_prompt=128, max_prompt=128, min_output=512, max_output=512)
        w64 = dict(requests=64, min_prompt=128, max_prompt=128, min_output=128, max_output=128)
        plan = [  # (name, shape, workload, ours' extra flags, peer, peer timeout)
            ("qwen3-nano", "qwen3-0.6b", NANO, (), "hf-cb", 60),
            ("qwen3-one", "qwen3-0.6b", w1, ("--gpu-memory-utilization", "0.3"), "hf-generate", 40),
            ("llama8b-one", "llama-3-8b", {**w1, "min_output": 256, "max_output": 256}, (), "hf-generate", 40),
            ("llama8b-64", "llama-3-8b", w64, (), "hf-generate", 40),
        ]
        for name, shape, wl, extra, _, _ in plan:  # ours first: a peer that runs long takes no number of ours
            ours_json = out / f"{name}.json"
            rec = run.phase(name, bench_cmd(shape, ours_json, extra=extra, **wl), 30, 120)
            entry = results["benches"][name] = {"shape": shape, "workload": wl, "ours": rec["status"]}
            if ours_json.is_file():
                entry["ours_report"] = json.loads(ours_json.read_text())
        for name, shape, wl, _, peer_name, peer_timeout in sorted(plan, key=lambda p: p[5]):  # quickest first
            peer_json = out / f"{name}-peer.json"
            prec = run.phase(f"{name}-peer", peer_cmd(shape, peer_json, peer_name, **wl), 20, peer_timeout)
            results["benches"][name]["peer"] = json.loads(peer_json.read_text()) if peer_json.is_file() else {
                "system": peer_name, "status": prec["status"]}
    results["phases"] = run.phases
    (out / "gpu_check.json").write_text(json.dumps(results, indent=2))
    print()
    print(summary(results))
    return 0 if all(p["status"] == "ok" for p in run.phases if not p["phase"].endswith("-peer")) else 1


def summary(results: dict) -> str:
    e = results["env"]
    lines = [f"GPU check on {e['device']} at {e['git']} ({e['date']}): torch {e['torch']}, Triton {e['triton']}, "
             f"transformers {e['transformers']}",
             "", "| phase | status | seconds |", "|---|---|---|"]
    lines += [f"| {p['phase']} | {p['status']} | {p.get('seconds', '-')} |" for p in results["phases"]]
    lines += ["", "| workload | hetero-infer tok/s | ms/token (1 request) | decode weight GB/s vs copy | peer | peer tok/s "
              "| ours/peer |", "|---|---|---|---|---|---|---|"]
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
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    pp = sub.add_parser("prepare", help="download the wheels and copy the default tokenizer into .gpucheck/")
    pp.add_argument("--python-version", default="3.12")
    pc = sub.add_parser("check", help="run the check (on the GPU machine)")
    pc.add_argument("out", type=Path)
    pc.add_argument("--budget-s", type=float, default=470)
    pc.add_argument("--no-suite", dest="suite", action="store_false")
    pc.add_argument("--no-bench", dest="benches", action="store_false")
    pe = sub.add_parser("peer")
    pe.add_argument("args", nargs="+")
    a = p.parse_args(argv)
    if a.cmd == "prepare":
        prepare(a.python_version)
        return 0
    if a.cmd == "peer":
        peer(*a.args)
        return 0
    return check(a.out, a.budget_s, a.suite, a.benches)


if __name__ == "__main__":
    sys.exit(main())

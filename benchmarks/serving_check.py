"""The GPU check's serving phase (issue 38): the OpenAI server on the GPU with a model shape's dummy weights, and
`hetero-infer bench serve` against it at each request rate, as vLLM's serving benchmark is run (random prompts,
fixed output lengths, ignore_eos), the published vLLM numbers beside.

    python benchmarks/serving_check.py --json OUT/serving.json            # Qwen3-0.6B shape, cuda, 512 in / 128 out

The shape's folder has no tokenizer: the server gets the shape's config.json with the tokenizer files of
`--tokenizer-from` (the default model's, which the GPU check carries; its ids lie inside Qwen3's vocabulary).
Random prompts are `--input-len` words (about as many tokens; the report gives the prompt tokens counted).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# vLLM 0.19 on one H100, Qwen3-0.6B, random 512 in / 128 out (issue 38): requests/s unbounded, TPOT at 16 req/s
PUBLISHED_VLLM = {"device": "H100", "version": "0.19", "req_per_s_unbounded": 94.9, "tpot_ms_at_16": 2.39}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default=str(ROOT / "benchmarks" / "shapes" / "qwen3-0.6b"),
                   help="a folder with the model's config.json")
    p.add_argument("--tokenizer-from", default=str(ROOT / ".gpucheck" / "default-model"),
                   help="a folder with tokenizer.json (and its config)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--num-prompts", type=int, default=1000)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--rates", default="inf,16", help="request rates (req/s; inf: all at once), comma-separated")
    p.add_argument("--startup-timeout", type=float, default=180.0)
    p.add_argument("--json", type=Path, required=True)
    return p


def model_folder(shape: Path, tokenizer_from: Path, dest: Path) -> Path:
    """The shape's config.json with the tokenizer files beside it."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(shape / "config.json", dest / "config.json")
    for f in tokenizer_from.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(f, dest / f.name)
    return dest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_cmd(folder: Path, port: int, device: str, dtype: str) -> list[str]:
    return [sys.executable, "-m", "hetero_infer.cli", "serve", "--model", str(folder), "--load-format", "dummy",
            "--device", device, "--dtype", dtype, "--port", str(port), "--served-model-name", "serving-check"]


def bench_args(port: int, rate: float, args: argparse.Namespace, out_json: Path) -> list[str]:
    return ["--url", f"http://127.0.0.1:{port}", "--num-prompts", str(args.num_prompts), "--request-rate", str(rate),
            "--input-len", str(args.input_len), "--output-len", str(args.output_len), "--output-json",
            str(out_json), "--no-progress"]


def wait_ready(port: int, proc: subprocess.Popen, timeout_s: float) -> float:
    """Seconds until /readyz answers 200; RuntimeError if the server exits or the time runs out."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}) before it was ready")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                if r.status == 200:
                    return time.monotonic() - t0
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the server was not ready after {timeout_s:.0f} s")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    rates = [math.inf if r.strip() == "inf" else float(r) for r in args.rates.split(",")]
    work = Path(tempfile.mkdtemp(prefix="serving-check-"))
    folder = model_folder(Path(args.shape), Path(args.tokenizer_from), work / "model")
    port = free_port()
    log = open(work / "server.log", "w")
    proc = subprocess.Popen(server_cmd(folder, port, args.device, args.dtype), stdout=log, stderr=subprocess.STDOUT,
                            cwd=ROOT, start_new_session=True)
    report: dict = {"shape": Path(args.shape).name, "device": args.device, "dtype": args.dtype,
                    "input_words": args.input_len, "output_len": args.output_len, "num_prompts": args.num_prompts,
                    "published_vllm": PUBLISHED_VLLM, "runs": []}
    try:
        report["startup_s"] = round(wait_ready(port, proc, args.startup_timeout), 1)
        for rate in rates:
            out = work / f"rate-{rate}.json"
            rc = subprocess.run([sys.executable, "-m", "hetero_infer.cli", "bench", "serve",
                                 *bench_args(port, rate, args, out)], cwd=ROOT).returncode
            run = {"request_rate": "inf" if math.isinf(rate) else rate, "rc": rc}
            if out.is_file():
                run["result"] = json.loads(out.read_text())
            report["runs"].append(run)
    except RuntimeError as exc:
        report["error"] = str(exc)
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
        log.close()
        report["server_log_tail"] = (work / "server.log").read_text(errors="replace").splitlines()[-20:]
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))
    ok = "error" not in report and all(r["rc"] == 0 and "result" in r for r in report["runs"])
    for r in report["runs"]:
        print(json.dumps({"request_rate": r["request_rate"], **{k: v for k, v in (r.get("result") or {}).items()
                                                               if not isinstance(v, (dict, list))}}))
    print("serving check:", "ok" if ok else report.get("error", "a bench run failed"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

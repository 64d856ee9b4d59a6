"""Convert the model `hetero-infer bench` loads into the GGUF files its llama.cpp peer reads
(`--peers ...,llama-cpp`), with llama.cpp's own `convert_hf_to_gguf.py` and its `gguf-py`, one file
per dtype, unquantized (float32 -> f32, bfloat16 -> bf16), at `peer_llamacpp.gguf_path(...)`.

The llama.cpp sources are those vendored in the llama-cpp-python sdist, e.g.:

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d /tmp/sdist
    tar xzf /tmp/sdist/llama_cpp_python-0.3.36.tar.gz -C /tmp
    pip install sentencepiece   # the converter's Llama vocabulary path imports it
    python -m benchmarks.llamacpp_gguf --llama-cpp-src /tmp/llama_cpp_python-0.3.36/vendor/llama.cpp
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from hetero_infer.bench.peer_llamacpp import GGUF_TYPES, gguf_path
from hetero_infer.worker.runner.loader import resolve_model


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--llama-cpp-src", type=Path, required=True, help="llama.cpp source tree (has convert_hf_to_gguf.py)")
    p.add_argument("--model", default=None, help="as `hetero-infer bench --model` (default: the default model)")
    p.add_argument("--dtypes", default="float32,bfloat16")
    args = p.parse_args(argv)
    folder, _ = resolve_model(args.model)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(args.llama_cpp_src / "gguf-py"),
                                                         os.environ.get("PYTHONPATH", "")])}
    for dtype in args.dtypes.split(","):
        out = gguf_path(folder, dtype)
        out.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, str(args.llama_cpp_src / "convert_hf_to_gguf.py"), str(folder),
               "--outtype", GGUF_TYPES[dtype], "--outfile", str(out)]
        print(" ".join(cmd), flush=True)
        subprocess.run(cmd, env=env, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

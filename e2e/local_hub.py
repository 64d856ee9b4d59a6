"""A local Hugging Face Hub for the kind suite: the model-source tests' Hub server (tests/sources/hub_server.py)
serving one private repository, a tiny random-weight llama (tests/quant's save_tiny_model: safetensors and the default model's
tokenizer) as REPO, on HOST:PORT, until killed. The pods reach it through HF_ENDPOINT, with HF_TOKEN.

    python e2e/local_hub.py --host 0.0.0.0 --port 8765 --repo e2e/tiny-llama

Prints "local hub serving REPO on URL" once it answers.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import threading
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path[:0] = [str(TESTS / "sources"), str(TESTS / "quant")]

from hub_server import LocalHub, Repo, folder_files  # noqa: E402
from quant_testing import save_tiny_model  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--repo", default="e2e/tiny-llama")
    parser.add_argument("--token", default="hf_e2e_token", help="the repository is private: HF_TOKEN must be this")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="e2e-hub-") as tmp:
        save_tiny_model("llama", Path(tmp))
        hub = LocalHub(token=args.token)
        hub.repos[args.repo] = repo = Repo(private=True)
        repo.add_commit(folder_files(Path(tmp)))
        hub.start(args.port, args.host)
        print(f"local hub serving {args.repo} on {hub.url}", flush=True)
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        stop.wait()
        hub.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

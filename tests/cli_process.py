"""A real `python -m hetero_infer.cli ...` process for end-to-end tests (the server's and the router's): its
output kept line by line, its URL read from the "listening on" line (they bind port 0), readiness from
/readyz."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

_LISTENING = re.compile(r"listening on http://([^:\s]+):(\d+)")


class CliProcess:
    def __init__(self, *args: str, env: dict[str, str] | None = None, start_timeout: float = 180.0) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "hetero_infer.cli", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        self.lines: list[str] = []
        self.url = ""
        self._port = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self._port.wait(start_timeout):
            self.stop()
            raise RuntimeError(f"{args[0]} did not start listening:\n" + self.log())

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            m = _LISTENING.search(line)
            if m and not self._port.is_set():
                self.url = f"http://{m.group(1)}:{m.group(2)}"
                self._port.set()

    def log(self) -> str:
        return "".join(self.lines)

    def wait_ready(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"exited with {self.proc.returncode}:\n" + self.log())
            try:
                with urllib.request.urlopen(self.url + "/readyz", timeout=2) as r:
                    if r.status == 200:
                        return
            except (OSError, urllib.error.HTTPError):
                pass
            time.sleep(0.1)
        raise RuntimeError("not ready:\n" + self.log())

    def terminate(self) -> None:
        self.proc.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM, then SIGKILL after `timeout` seconds; the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

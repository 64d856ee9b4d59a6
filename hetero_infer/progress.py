"""Progress of a long first-start step (a download, a conversion): a tqdm bar when stderr is a terminal, else a
log line every `interval` seconds (bytes done of total, percent, rate), so a server's log shows that it is
working. Progress is polled from a `measure()` callable on a daemon thread, so the step itself needs no hooks.
Imports nothing heavy (the operator's download Job reuses it)."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from types import TracebackType

logger = logging.getLogger("hetero_infer.progress")

DEFAULT_INTERVAL_S = 10.0


def human_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def progress_line(label: str, done: int, total: int | None, elapsed: float) -> str:
    """'label: 12.0 MB of 48.0 MB (25%), 3.0 MB/s, 4 s' (without a total: bytes and rate only)."""
    rate = done / elapsed if elapsed > 0 else 0.0
    amount = human_bytes(done)
    if total:
        amount += f" of {human_bytes(total)} ({min(100.0, 100.0 * done / total):.0f}%)"
    return f"{label}: {amount}, {human_bytes(rate)}/s, {elapsed:.0f} s"


class Progress:
    """`with Progress(label, total, measure):` reports `measure()` (bytes done) while the block runs.

    `measure=None` is a heartbeat: a line with the elapsed time and the current `step` (a step without byte
    counts, such as dequantizing a GGUF). `tty=None` follows stderr."""

    def __init__(self, label: str, total: int | None = None, measure: Callable[[], int] | None = None, *,
                 interval: float = DEFAULT_INTERVAL_S, tty: bool | None = None,
                 log: logging.Logger = logger) -> None:
        self.label = label
        self.total = total
        self.measure = measure
        self.interval = interval
        self.tty = sys.stderr.isatty() if tty is None else tty
        self.log = log
        self.step = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar = None
        self._start = 0.0

    def __enter__(self) -> Progress:
        self._start = time.monotonic()
        if self.tty and self.measure is not None:
            from tqdm import tqdm

            self._bar = tqdm(total=self.total, desc=self.label, unit="B", unit_scale=True, leave=False)
        self._thread = threading.Thread(target=self._run, name="progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._bar is not None:
            self._bar.close()

    def set_step(self, step: str) -> None:
        self.step = step
        if self._bar is None:
            self.log.info("%s: %s", self.label, step)

    def line(self) -> str:
        elapsed = time.monotonic() - self._start
        if self.measure is None:
            return f"{self.label}: {self.step or 'working'}, {elapsed:.0f} s"
        return progress_line(self.label, self._done(), self.total, elapsed)

    def _done(self) -> int:
        try:
            return int(self.measure())  # type: ignore[misc]
        except OSError:  # a file vanished between listing and stat (a finished part renamed): next time
            return 0

    def _run(self) -> None:
        period = min(self.interval, 0.5) if self._bar is not None else self.interval
        while not self._stop.wait(period):
            if self._bar is not None:
                self._bar.n = self._done()
                self._bar.refresh()
            else:
                self.log.info("%s", self.line())


@contextmanager
def library_bars_off(hub: bool = True, transformers: bool = True) -> Iterator[None]:
    """The progress bars huggingface_hub and transformers draw themselves (one per file; "Converting and
    de-quantizing GGUF tensors", "Writing model shards") give way to Progress's: a bar on a terminal, log lines
    elsewhere, where their carriage returns would only garble a pod's log. Restored on exit."""
    undo: list[Callable[[], None]] = []
    try:
        if hub:
            from huggingface_hub.utils import (
                are_progress_bars_disabled,
                disable_progress_bars,
                enable_progress_bars,
            )

            if not are_progress_bars_disabled():
                disable_progress_bars()
                undo.append(enable_progress_bars)
        if transformers:
            from transformers.utils import logging as hf_logging

            if hf_logging.is_progress_bar_enabled():
                hf_logging.disable_progress_bar()
                undo.append(hf_logging.enable_progress_bar)
            # The GGUF reader draws its bar with tqdm directly, past transformers' switch.
            import transformers.modeling_gguf_pytorch_utils as gguf_utils

            bar = getattr(gguf_utils, "tqdm", None)
            if bar is not None:
                gguf_utils.tqdm = partial(bar, disable=True)
                undo.append(lambda: setattr(gguf_utils, "tqdm", bar))
        yield
    finally:
        for step in reversed(undo):
            step()

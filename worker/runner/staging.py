"""A step's integer inputs on their way to the device: packed into a persistent pinned host buffer and copied
with ONE non-blocking copy into a persistent device buffer, of which the model and the attention backend read
views. No device tensor is allocated for them and nothing waits for the device.

- `Uploader`: two pinned host buffers (alternating: the host fills step N+1's while step N's copy may still be
  queued; each one's last copy is fenced by an event the host waits on before writing it again, which in the
  engine's order has always passed) and one device buffer. The CUDA-graph decode runner lays its own static
  inputs out in one.
- `StagingArea`: an `Uploader` filled in order by a `Pack` (every array at the next aligned offset), grown when
  a step needs more room than it has (rare: 64 KiB to start, and where the KV pool is sized from the memory
  profile, the profiling step, the largest there is, grows it at start-up).
  The executor keeps a second one for the sampler's inputs of a sampled step
  (runner/sampling_inputs.py: indices, parameter columns, penalty and bias keys), one more copy for those steps.
- `DirectPack`: the same interface with no staging: each array is a tensor on its own (on the CPU a view of the
  host array: nothing is copied there, since the host is the device), for code that prepares one batch outside
  the engine's steps (calibration, tests).

Only host writes may happen while a step is packed (a `Pack` that runs out of room throws the step's packing
away and runs it again, larger); device work on the views comes after `StagingArea.pack` returns, when the copy
is queued before it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
import torch

log = logging.getLogger(__name__)

T = TypeVar("T")
ALIGN = 64  # bytes; every array starts aligned (Triton specialises its kernels on 16-byte aligned pointers)
INITIAL_BYTES = 1 << 16

_TORCH_DTYPES = {np.dtype(np.int64): torch.int64, np.dtype(np.int32): torch.int32,
                 np.dtype(np.float32): torch.float32, np.dtype(np.bool_): torch.bool}


def pad_tables(tables: list[list[int]], out: np.ndarray | None = None) -> np.ndarray:
    """Block tables as one zero-padded int32 array [len(tables), longest] (written into `out` if given)."""
    if out is None:
        out = np.zeros((len(tables), max(len(t) for t in tables)), dtype=np.int32)
    else:
        out.fill(0)
    for i, t in enumerate(tables):
        out[i, : len(t)] = t
    return out


def to_device(array: np.ndarray | torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host array as a tensor on `device`; on CUDA copied from pinned memory without blocking the host."""
    t = torch.from_numpy(array) if isinstance(array, np.ndarray) else array
    if device.type == "cpu":
        return t
    return t.pin_memory().to(device, non_blocking=True)


class Uploader:
    """Two pinned host buffers of `nbytes` and one device buffer; `host()` hands out the next host buffer,
    `upload(n)` copies its first `n` bytes to the device buffer, without blocking the host."""

    def __init__(self, device: torch.device, nbytes: int) -> None:
        self.device = torch.device(device)
        self.nbytes = nbytes
        cuda = self.device.type == "cuda"
        self._host = [torch.zeros(nbytes, dtype=torch.uint8, pin_memory=cuda) for _ in range(2)]
        self.host_arrays = [h.numpy() for h in self._host]
        self.device_buffer = torch.zeros(nbytes, dtype=torch.uint8, device=self.device)
        self._events = [torch.cuda.Event(), torch.cuda.Event()] if cuda else None
        self._next = 0
        self.copies = 0  # host-to-device copies issued (one a step)

    def host(self) -> tuple[int, np.ndarray]:
        """(index, bytes) of the host buffer to fill next, once the copy that last read it has run."""
        i = self._next
        if self._events is not None:
            self._events[i].synchronize()  # returns at once in the engine's order: that step's result was read
        return i, self.host_arrays[i]

    def upload(self, i: int, nbytes: int) -> None:
        """Copy the first `nbytes` of host buffer `i` into the device buffer (queued on the current stream)."""
        self.device_buffer[:nbytes].copy_(self._host[i][:nbytes], non_blocking=True)
        if self._events is not None:
            self._events[i].record()
        self._next = i ^ 1
        self.copies += 1

    def wait_idle(self) -> None:
        """Every copy from the host buffers has run (before they are freed)."""
        if self._events is not None:
            for event in self._events:
                event.synchronize()


class _Full(Exception):
    def __init__(self, needed: int) -> None:
        self.needed = needed


class Pack:
    """One step's arrays written one after another into a host buffer; each `put` returns the array's view in
    the device buffer (valid once the step's copy is queued)."""

    __slots__ = ("_host", "_device", "used")

    def __init__(self, host: np.ndarray, device_buffer: torch.Tensor) -> None:
        self._host, self._device, self.used = host, device_buffer, 0

    def _claim(self, nbytes: int) -> int:
        start = self.used
        end = start + nbytes
        if end > self._host.shape[0]:
            raise _Full(end)
        self.used = -(-end // ALIGN) * ALIGN
        return start

    def put(self, values: np.ndarray | Sequence, dtype=np.int64) -> torch.Tensor:
        """`values` (an array, or a list of numbers or of equal-length rows) as a device tensor of its shape
        (int64, int32, float32 or bool)."""
        a = np.asarray(values, dtype=dtype)
        start = self._claim(a.nbytes)
        end = start + a.nbytes
        self._host[start:end].view(a.dtype).reshape(a.shape)[...] = a
        return self._device[start:end].view(_TORCH_DTYPES[a.dtype]).view(a.shape)

    def table(self, tables: list[list[int]]) -> torch.Tensor:
        """Block tables as one zero-padded int32 tensor [len(tables), longest] (`pad_tables`)."""
        width = max(len(t) for t in tables)
        nbytes = len(tables) * width * 4
        start = self._claim(nbytes)
        pad_tables(tables, self._host[start : start + nbytes].view(np.int32).reshape(len(tables), width))
        return self._device[start : start + nbytes].view(torch.int32).view(len(tables), width)


class DirectPack:
    """`Pack`'s interface without staging: each array its own tensor on `device` (on the CPU, a view of the host
    array)."""

    __slots__ = ("device",)

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def put(self, values: np.ndarray | Sequence, dtype=np.int64) -> torch.Tensor:
        return to_device(np.asarray(values, dtype=dtype), self.device)

    def table(self, tables: list[list[int]]) -> torch.Tensor:
        return to_device(pad_tables(tables), self.device)


class StagingArea:
    """Where an executor's steps pack their integer inputs: `pack(fill)` runs `fill` with a `Pack` (host writes
    only), then copies everything it put with one copy. Unstaged (`staged=False`, the default on the CPU)
    `fill` gets a `DirectPack`: there is no device to copy to."""

    def __init__(self, device: torch.device, staged: bool | None = None, nbytes: int = INITIAL_BYTES) -> None:
        self.device = torch.device(device)
        self.staged = self.device.type != "cpu" if staged is None else staged
        self._direct = DirectPack(self.device)
        self.uploader = Uploader(self.device, nbytes) if self.staged else None
        self.grows = 0

    @property
    def copies(self) -> int:
        return self.uploader.copies if self.uploader is not None else 0

    def pack(self, fill: Callable[[Pack | DirectPack], T]) -> T:
        if self.uploader is None:
            return fill(self._direct)
        while True:
            up = self.uploader
            i, host = up.host()
            pack = Pack(host, up.device_buffer)
            try:
                out = fill(pack)
            except _Full as full:
                self._grow(full.needed)
                continue
            up.upload(i, pack.used)
            return out

    def _grow(self, needed: int) -> None:
        old = self.uploader
        nbytes = max(2 * old.nbytes, 1 << (needed - 1).bit_length())
        log.debug("step input staging grows from %d to %d bytes (a step needed %d)", old.nbytes, nbytes, needed)
        old.wait_idle()
        self.uploader = Uploader(self.device, nbytes)
        self.uploader.copies = old.copies
        self.grows += 1

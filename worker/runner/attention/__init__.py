"""Attention backends: PyTorch reference, Triton, CPU C kernels, behind one interface (`AttentionBackend`).

`select_backend` picks one for a device and dtype, once, when the executor builds the model.
"""

from __future__ import annotations

import logging

import torch

from hetero_infer.worker.runner.attention import cpu_backend
from hetero_infer.worker.runner.attention.base import AttentionBackend, KVCache, SeqSpan, StepBatch
from hetero_infer.worker.runner.attention.cpu_backend import CpuAttentionMetadata, CpuBackend
from hetero_infer.worker.runner.attention.torch_backend import (
    PrefillChunk,
    TorchAttentionMetadata,
    TorchBackend,
)
from hetero_infer.worker.runner.models.rotary import RotaryEmbedding

__all__ = [
    "AttentionBackend", "CpuAttentionMetadata", "CpuBackend", "KVCache", "PrefillChunk", "SeqSpan", "StepBatch",
    "TorchAttentionMetadata", "TorchBackend", "select_backend", "triton_available",
]

log = logging.getLogger(__name__)


def select_backend(device: torch.device, dtype: torch.dtype, rope: RotaryEmbedding) -> AttentionBackend:
    """Triton where its kernels run (CUDA, or anywhere with HETERO_INFER_KERNELS=triton, e.g. in Triton's
    interpreter); else on the CPU the C kernels where they built for `dtype`; else the PyTorch reference."""
    if triton_available(device):
        from hetero_infer.worker.runner.attention.triton_backend import TritonBackend

        return TritonBackend(rope, device)
    if device.type == "cpu" and cpu_backend.available(dtype):
        return CpuBackend(rope)
    return TorchBackend(rope, device)


def triton_available(device: torch.device) -> bool:
    try:
        from hetero_infer import kernels
    except Exception as exc:  # a broken install: fall back to the reference path
        log.warning("kernels unavailable, using the PyTorch reference path: %s", exc)
        return False
    if kernels.get_backend() == "triton":
        return True
    return device.type == "cuda" and kernels.get_backend() == "auto" and kernels.triton_available()

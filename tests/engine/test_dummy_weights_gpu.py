"""`load_format="dummy"` on CUDA at full size: the Llama-3-8B shape (16 GB of bfloat16 weights) is made on the GPU
in bfloat16, without a float32 copy and without the host holding it (a GPU machine's host may have less memory
than the model's float32 size)."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest
import torch

from hetero_infer.worker.runner.loader import load_hf_config, load_model

pytestmark = pytest.mark.gpu
SHAPES = Path(__file__).resolve().parents[2] / "benchmarks" / "shapes"


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@pytest.mark.xdist_group("gpu-memory")  # 16 GB: never beside the tests that size a pool from the free memory
def test_llama3_8b_shape_is_made_on_the_gpu_in_bfloat16():
    folder = SHAPES / "llama-3-8b"
    config = load_hf_config(folder)
    device = torch.device("cuda")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before_gpu, before_rss = torch.cuda.memory_allocated(), _peak_rss_bytes()
    model = load_model(config, folder, load_format="dummy", device=device, dtype=torch.bfloat16,
                       max_positions=1024, seed=0)
    torch.cuda.synchronize()
    params = list(model.parameters())
    weight_bytes = sum(p.numel() * p.element_size() for p in params)
    assert {p.dtype for p in params} == {torch.bfloat16} and {p.device.type for p in params} == {"cuda"}
    assert sum(p.numel() for p in params) == 8_030_261_248
    largest = max(p.numel() * p.element_size() for p in params)  # one dummy tensor beside the weights at a time
    assert torch.cuda.max_memory_allocated() - before_gpu <= weight_bytes + 2 * largest
    assert _peak_rss_bytes() - before_rss < 2 * 2**30, "the host held a copy of the weights"
    for p in [p for p in params if p.dim() == 2][:4]:  # uniform within sqrt(3) * initializer_range (0.02)
        assert torch.isfinite(p).all() and p.float().abs().max() <= 0.035
    del model, params

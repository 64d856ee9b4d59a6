from __future__ import annotations

import gc
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "quant"))  # quant_testing


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """Factory: arch -> (folder, float32 HF model on the CPU); random weights, the default tokenizer."""
    from quant_testing import tiny_model_factory

    return tiny_model_factory(tmp_path_factory, "gpu")


@pytest.fixture(autouse=True)
def release_cuda_memory():
    """Each test's engines hold most of the GPU (KV pools): free them before the next test."""
    yield
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
